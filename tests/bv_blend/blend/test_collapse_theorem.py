"""The collapse theorem (spec section 1), shown on verl's own registered estimators.

GRPO's advantage of a group whose rollouts all get the same reward is exactly zero, whatever epsilon.
BV-Blend gives that same group a non-zero advantage once its cluster has history (w > 0, v > 0, R != b),
and with no history anywhere it *is* verl's GRPO.
"""

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from bv_blend import BVBlendConfig, BVBlendEstimator
from tests._estimator_helpers import batch_of_groups


def token_level(rewards: torch.Tensor, length: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's layout: the sequence reward on the last response token, right-padded responses."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (rewards.numel(),), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    token_rewards = torch.zeros(rewards.numel(), length)
    token_rewards[torch.arange(rewards.numel()), lengths - 1] = rewards
    return token_rewards, mask


@pytest.mark.parametrize("epsilon", [1e-6, 1e-8, 1e-2])
@pytest.mark.parametrize("reward", [0.0, 1.0])
def test_verl_grpo_gives_exactly_zero_for_an_all_equal_group(reward, epsilon):
    grpo = get_adv_estimator_fn("grpo")
    rewards, uids, _ = batch_of_groups([[reward] * 8, [0, 1, 1, 0, 1, 0, 0, 1]], [0, 0])
    token_rewards, mask = token_level(rewards)
    advantages, _ = grpo(token_level_rewards=token_rewards, response_mask=mask, index=uids, epsilon=epsilon)
    assert torch.count_nonzero(advantages[:8]) == 0
    assert torch.count_nonzero(advantages[8:]) > 0


@pytest.mark.parametrize("weight_mode", ["sem", "fixed", "neff", "sigma"])
def test_bv_blend_gives_the_collapsed_group_a_signal_once_its_cluster_has_history(weight_mode):
    config = BVBlendConfig(weight_mode=weight_mode, temperature=1.0)
    estimator = BVBlendEstimator(num_clusters=2, config=config)
    grpo = get_adv_estimator_fn("grpo")

    # Step 1: cluster 0 sees a mixed group, so it has history with v > 0 and mean 0.5.
    estimator.compute(*batch_of_groups([[0, 1, 0, 1]], [0], "warmup"))

    # Step 2: the same batch for GRPO and BV-Blend: an all-correct and an all-wrong group of cluster 0.
    rewards, uids, clusters = batch_of_groups([[1] * 8, [0] * 8], [0, 0], "step2")
    token_rewards, mask = token_level(rewards)
    grpo_advantages, _ = grpo(token_level_rewards=token_rewards, response_mask=mask, index=uids)
    bv_advantages, _ = estimator.compute_token_level(token_rewards, mask, uids, clusters)

    assert torch.count_nonzero(grpo_advantages) == 0
    sequence = bv_advantages.sum(-1) / mask.sum(-1)
    assert (sequence[:8] > 0).all(), "all-correct group of a 50% cluster must be pushed up"
    assert (sequence[8:] < 0).all(), "all-wrong group of a 50% cluster must be pushed down"
    assert torch.equal(bv_advantages != 0, mask != 0), "every response token carries the signal"
    assert estimator.metrics["bv_blend/effective_signal_ratio"] == 1.0
    assert estimator.metrics["bv_blend/grpo_signal_ratio"] == 0.0


def random_batch(seed: int, binary: bool):
    generator = np.random.default_rng(seed)
    sizes = generator.integers(2, 9, size=generator.integers(1, 12))
    group_rewards = [
        (generator.integers(0, 2, size) if binary else generator.normal(size=size)).astype(float).tolist()
        for size in sizes
    ]
    rewards, uids, _ = batch_of_groups(group_rewards, [0] * len(sizes), f"s{seed}")
    order = generator.permutation(len(rewards))  # verl does not keep groups contiguous
    return rewards[order], uids[order]


@pytest.mark.parametrize("estimator_name", ["grpo", "grpo_vectorized"])
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("seed", range(10))
def test_without_history_bv_blend_is_verl_grpo(estimator_name, binary, seed):
    """w = 0 everywhere: unseen clusters (a fresh estimator) and rows with no cluster (-1)."""
    rewards, uids = random_batch(seed, binary)
    token_rewards, mask = token_level(rewards, seed=seed)
    expected, _ = get_adv_estimator_fn(estimator_name)(token_level_rewards=token_rewards, response_mask=mask,
                                                        index=uids, epsilon=1e-6)
    generator = np.random.default_rng(seed)
    for clusters in (torch.from_numpy(generator.integers(0, 4, len(uids))), torch.full((len(uids),), -1)):
        # Cluster ids must be constant per group.
        _, codes = np.unique(uids, return_inverse=True)
        group_clusters = clusters[: codes.max() + 1]
        estimator = BVBlendEstimator(num_clusters=4)
        actual, _ = estimator.compute_token_level(token_rewards, mask, uids, group_clusters[codes])
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
