"""Failure cases that other RL libraries reported, checked on our estimators through verl's real code on CPU.

1. Rows whose response mask verl's rollout correction zeroes (rejection sampling, ``rollout_rs``) must count in no
   group's statistics and in no history: verl's issues #6362 and #6452 report that its built-in estimators still
   count them.
2. A group whose rewards differ only by float32 noise must not blow one advantage up: NVIDIA-NeMo/RL#4161 saw
   advantages of 4,000 from a one-pass variance (``E[R^2] - E[R]^2``) of rewards that are not dyadic.

The third case (a vLLM engine that dies during generation) is an end-to-end run: ``tests/e2e``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo import rollout_corr_helper as rollout_corr

from bv_blend import BVBlendConfig, BVBlendEstimator
from bv_blend.codebook import CLUSTER_KEY
from bv_blend.verl import runtime
from tests.bv_blend.verl._companion_helpers import algorithm, group_batch, sequence_advantages

CALLS = ([[1, 0, 0, 1], [1, 1, 1, 0], [0, 0, 1]], [[0, 1, 0, 0], [1, 1, 0, 1], [1, 1, 1]])
DRIFTED = (1, 4, 9)  # rows whose rollout log-probs drifted from the trainer's: rejection sampling drops them
K = 2


def _algorithm(estimator: str):
    if estimator == "bv_blend":
        return OmegaConf.create({"adv_estimator": "bv_blend", "bv_blend": {"num_clusters": K}})
    return algorithm(estimator)


def _batch(groups: list[list[float]], call: int, drifted: tuple[int, ...]):
    """A legacy batch with the trainer's and the rollout's log-probs, each prompt's cluster in extra_info."""
    data = group_batch(groups, prefix=f"c{call}g", seed=call)
    rows, length = data.batch["response_mask"].shape
    group_of_row = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    data.non_tensor_batch["extra_info"] = np.array([{CLUSTER_KEY: int(g % K)} for g in group_of_row], dtype=object)
    data.batch["old_log_probs"] = torch.zeros(rows, length)
    rollout = torch.zeros(rows, length)
    rollout[list(drifted)] = -2.0  # k2 = 0.5 (2)^2 = 2 > the threshold 0.5 on every token of those rows
    data.batch["rollout_log_probs"] = rollout
    return data


def _rejected(data):
    """verl's own rollout correction, sequence-level rejection sampling, as RayPPOTrainer.fit runs it."""
    config = OmegaConf.create({"rollout_is": None, "rollout_rs": "seq_max_k2", "rollout_rs_threshold": "0.5"})
    data, _ = rollout_corr.compute_rollout_correction_and_add_to_batch(data, config)
    return data


def _advantages(estimator: str, data):
    out = ray_trainer.compute_advantage(data, adv_estimator=estimator, config=_algorithm(estimator))
    return sequence_advantages(out)


def _state(estimator: str):
    built = runtime.estimator_for(estimator, _algorithm(estimator))
    return (built.estimator if estimator == "bv_blend" else built).state_dict() if estimator != "maxnorm_ac" else {}


def _assert_same(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    else:
        assert a == b, where


@pytest.mark.parametrize("estimator", ["bv_blend", "ha_dw", "maxnorm_ac"])
def test_rows_that_rollout_correction_rejects_count_in_no_group_and_no_history(estimator):
    """Two calls with rejected rows give the kept rows the advantages, and the estimator the history, of the same
    calls without those rows at all; the rejected rows get 0."""
    runtime.reset()
    with_rejected = []
    for call, groups in enumerate(CALLS):
        data = _rejected(_batch(groups, call, DRIFTED))
        assert (data.batch["response_mask"][list(DRIFTED)].sum(-1) == 0).all(), "verl did not reject the rows"
        with_rejected.append(_advantages(estimator, data))
    state_with_rejected = _state(estimator)

    runtime.reset()
    for call, groups in enumerate(CALLS):
        data = _batch(groups, call, ())
        keep = [i for i in range(len(data)) if i not in DRIFTED]
        advantages = _advantages(estimator, data.select_idxs(keep))
        torch.testing.assert_close(with_rejected[call][keep], advantages, rtol=0, atol=0)
        assert with_rejected[call][list(DRIFTED)].abs().sum() == 0
    _assert_same(_state(estimator), state_with_rejected)


def _float32_noise_group(value: float, rows: int, seed: int) -> torch.Tensor:
    """``rows`` rewards equal to ``value`` up to float32 rounding: sums of the same token rewards in another order,
    as verl's sum over a response's token rewards can give (0.35 is not dyadic, so each order rounds differently)."""
    rng = np.random.default_rng(seed)
    parts = np.full(7, value / 7, dtype=np.float32)
    sums = [np.add.reduce(rng.permutation(parts) * np.float32(1.0 + 1e-7 * rng.standard_normal()), dtype=np.float32)
            for _ in range(rows)]  # fmt: skip
    rewards = torch.tensor(sums, dtype=torch.float32)
    assert rewards.unique().numel() > 1 and (rewards - value).abs().max() < 1e-6, rewards  # noise, and only noise
    return rewards


@pytest.mark.parametrize("options", [{}, {"variance_floor": "none", "max_abs_advantage": None}])
def test_rewards_that_differ_only_by_float32_noise_get_no_large_advantage(options):
    """With no history (verl's GRPO arithmetic) and with a history of the same reward (w near 1 without the floor),
    noise-level spreads stay noise-level: |A| below 0.1, where a one-pass variance on such rewards reached 10^3."""
    estimator = BVBlendEstimator(1, BVBlendConfig(**options))
    groups = np.repeat(np.arange(4), 8)
    clusters = torch.zeros(32, dtype=torch.long)
    for call in range(20):
        rewards = torch.cat([_float32_noise_group(0.35, 8, seed=100 * call + g) for g in range(4)])
        advantages = estimator.compute(rewards, groups, clusters)
        assert advantages.abs().max() < 0.1, (call, advantages.abs().max())
    assert estimator.metrics["bv_blend/weight_mean"] > 0  # the later calls had a history to blend
