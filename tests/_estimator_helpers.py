"""Small builders shared by the estimator tests."""

from __future__ import annotations

import numpy as np
import torch

from bv_blend import BVBlendEstimator


def batch_of_groups(
    group_rewards: list[list[float]], group_clusters: list[int], prefix: str = "uid"
) -> tuple[torch.Tensor, np.ndarray, torch.Tensor]:
    """Rows of whole groups: rewards, uid strings as verl passes them (numpy object array), cluster ids."""
    rewards, uids, clusters = [], [], []
    for index, (group, cluster) in enumerate(zip(group_rewards, group_clusters, strict=True)):
        rewards += group
        uids += [f"{prefix}-{index}"] * len(group)
        clusters += [cluster] * len(group)
    return torch.tensor(rewards, dtype=torch.float32), np.array(uids, dtype=object), torch.tensor(clusters)


def state_tensors(estimator: BVBlendEstimator) -> dict[str, torch.Tensor]:
    state = estimator.state_dict()
    return {name: state[name] for name in ("count", "mean", "second_moment", "seen")}


def assert_same_state(left: BVBlendEstimator, right: BVBlendEstimator) -> None:
    """Bit-for-bit equality of the moments and the update count."""
    for name, tensor in state_tensors(left).items():
        assert torch.equal(tensor, state_tensors(right)[name]), name
    assert left.num_updates == right.num_updates
