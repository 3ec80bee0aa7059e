"""Reports on training runs: the training-dynamics figures."""

from bv_blend.paper.report.dynamics import (
    PANELS,
    load_run,
    plot_dynamics,
    read_jsonl_log,
    read_tensorboard_log,
    summarise,
)

__all__ = ["PANELS", "load_run", "plot_dynamics", "read_jsonl_log", "read_tensorboard_log", "summarise"]
