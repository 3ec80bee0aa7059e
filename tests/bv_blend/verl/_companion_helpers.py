"""Batches for the companion estimators' glue tests, laid out as verl's trainers hand them to ``compute_advantage``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from bv_blend.verl.records import record_for

RESPONSE_LEN = 6


def algorithm(estimator: str, **options: Any) -> DictConfig:
    """``config.algorithm`` as verl passes it: the estimator, verl's GRPO switch and our options sub-node."""
    node: dict[str, Any] = {"adv_estimator": estimator, "norm_adv_by_std_in_grpo": options.pop("norm", True)}
    record = record_for(estimator)
    if record is not None:
        node[record.section] = options
    return OmegaConf.create(node)


def group_batch(groups: list[list[float]], prefix: str = "u", pad_rows: int = 0, seed: int = 0):
    """A legacy ``DataProto``: one uid per group, each row's reward on its last response token (float64),
    responses of random length, then ``pad_rows`` of verl's padding (uid ``pad...``, empty mask, NaN rewards)."""
    from verl import DataProto

    rng = np.random.default_rng(seed)
    rewards = [float(r) for group in groups for r in group]
    group_uids = [f"{prefix}{g}x{rng.integers(1 << 30):08x}" for g in range(len(groups))]
    uids = [group_uids[g] for g, group in enumerate(groups) for _ in group]
    rows = len(rewards)
    lengths = rng.integers(1, RESPONSE_LEN + 1, rows)
    mask = torch.zeros(rows + pad_rows, RESPONSE_LEN, dtype=torch.int64)
    scores = torch.zeros(rows + pad_rows, RESPONSE_LEN, dtype=torch.float64)
    for i, (length, reward) in enumerate(zip(lengths, rewards, strict=True)):
        mask[i, :length] = 1
        scores[i, length - 1] = reward
    scores[rows:] = float("nan")  # junk in padding rows must be ignored
    uids += [f"pad{i:08x}" for i in range(pad_rows)]
    return DataProto.from_dict(
        tensors={"token_level_scores": scores, "token_level_rewards": scores.clone(), "response_mask": mask},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )


def sequence_advantages(data) -> torch.Tensor:
    """Each row's advantage (the value broadcast over its response tokens; 0 for empty rows)."""
    advantages, mask = data.batch["advantages"], data.batch["response_mask"]
    return advantages.sum(-1) / mask.sum(-1).clamp_min(1)


def run(estimator: str, groups: list[list[float]], config: DictConfig | None = None, **kwargs: Any):
    """verl's real legacy ``compute_advantage`` on ``group_batch(groups)``; returns the DataProto."""
    from verl.trainer.ppo import ray_trainer

    config = config if config is not None else algorithm(estimator)
    norm = bool(config.get("norm_adv_by_std_in_grpo", True))
    return ray_trainer.compute_advantage(
        group_batch(groups, **kwargs), adv_estimator=estimator, norm_adv_by_std_in_grpo=norm, config=config
    )
