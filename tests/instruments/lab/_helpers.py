"""Small settings shared by the lab tests (fast: a few prompts, a few steps)."""

from __future__ import annotations

import numpy as np
import torch

from instruments.lab.env import EnvConfig
from instruments.lab.estimators import ESTIMATORS
from instruments.lab.run import RunSpec, run

SMALL = EnvConfig(num_clusters=4, prompts_per_cluster=8, prompts_per_step=6, group_size=4, feature_dim=16)


def traced(key: str, steps: int = 12, seed: int = 1, env: EnvConfig = SMALL, **spec) -> list[dict[str, np.ndarray]]:
    """The per-step batches (rewards, uids, clusters, advantages, ...) of one lab run."""
    trace: list[dict[str, np.ndarray]] = []
    run(RunSpec(ESTIMATORS[key], env=env, steps=steps, seed=seed, **spec), trace=trace)
    return trace


def verl_face(step: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    """A traced step as verl hands it to an estimator: (B, 1) float32 rewards, int64 mask, row uids, row clusters."""
    group_size = step["rewards"].shape[1]
    rewards = torch.from_numpy(step["rewards"].reshape(-1, 1).astype(np.float32))
    mask = torch.ones_like(rewards, dtype=torch.int64)
    return rewards, mask, np.repeat(step["uids"], group_size), np.repeat(step["cluster_ids"], group_size)


def lab_advantages(step: dict[str, np.ndarray]) -> np.ndarray:
    return step["advantages"].ravel()
