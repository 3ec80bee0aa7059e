"""The paper's experiment kit: compose the paper configs and build the training command."""

from bv_blend.paper.configs import (
    BASE_CONFIG,
    COMPARISONS,
    MAIN_CONFIG,
    PAPER_CONFIGS,
    compose_paper_config,
    config_diff,
    config_dir,
)
from bv_blend.paper.launch import TrainLaunch, build_train_launch

__all__ = [
    "BASE_CONFIG",
    "COMPARISONS",
    "MAIN_CONFIG",
    "PAPER_CONFIGS",
    "TrainLaunch",
    "build_train_launch",
    "compose_paper_config",
    "config_diff",
    "config_dir",
]
