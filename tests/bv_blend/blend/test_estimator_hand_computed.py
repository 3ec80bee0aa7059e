"""Hand-computed cases: each number below is worked out with scalar arithmetic from the spec's formulas."""

import math

import numpy as np
import pytest
import torch

from bv_blend import BVBlendConfig, BVBlendEstimator
from tests._estimator_helpers import batch_of_groups, state_tensors

EPS = 1e-6


def run(estimator, group_rewards, group_clusters, prefix):
    rewards, uids, clusters = batch_of_groups(group_rewards, group_clusters, prefix)
    return estimator.compute(rewards, uids, clusters)


@pytest.fixture
def estimator_after_two_calls():
    """K=2, gamma=0.5, n0=2, v_prior=0.25, T=1.

    Call 1: cluster 0 sees [1, 0, 1, 1]: S1 = 3, S2 = 3, n = 4.
      cold start: N = 2, m1 = 0.75, m2 = 0.75^2 + 0.25 = 0.8125
      EMA:        N = 0.5*2 + 4 = 5, m1 = (1*0.75 + 3)/5 = 0.75, m2 = (1*0.8125 + 3)/5 = 0.7625
    Call 2: cluster 1 sees [0, 0]; cluster 0 is absent and ages.
      cluster 0:  N = 2.5, m1 = 0.75, m2 = 0.7625 (v = 0.2)
      cluster 1:  cold start N = 2, m1 = 0, m2 = 0.25; EMA N = 1 + 2 = 3, m1 = 0, m2 = 0.25/3
    """
    config = BVBlendConfig(gamma=0.5, n0=2.0, v_prior=0.25, temperature=1.0)
    estimator = BVBlendEstimator(num_clusters=2, config=config)
    run(estimator, [[1, 0, 1, 1]], [0], "call1")
    run(estimator, [[0, 0]], [1], "call2")
    return estimator


def test_cold_start_ema_update_and_ageing(estimator_after_two_calls):
    state = state_tensors(estimator_after_two_calls)
    torch.testing.assert_close(state["count"], torch.tensor([2.5, 3.0], dtype=torch.float64))
    torch.testing.assert_close(state["mean"], torch.tensor([0.75, 0.0], dtype=torch.float64))
    torch.testing.assert_close(state["second_moment"], torch.tensor([0.7625, 0.25 / 3], dtype=torch.float64))
    assert state["seen"].tolist() == [True, True]
    assert estimator_after_two_calls.num_updates == 2


def test_first_call_is_pure_prompt_local():
    """No history: w = 0, so the advantage is GRPO's (R - mean) / (std + eps)."""
    estimator = BVBlendEstimator(num_clusters=2)
    advantages = run(estimator, [[1, 0, 1, 1]], [0], "a")
    std = math.sqrt(((1 - 0.75) ** 2 * 3 + 0.75**2) / 3)
    expected = [(r - 0.75) / (std + EPS) for r in (1, 0, 1, 1)]
    torch.testing.assert_close(advantages, torch.tensor(expected))
    assert estimator.metrics["bv_blend/cold_start_group_ratio"] == 1.0
    assert estimator.metrics["bv_blend/weight_mean"] == 0.0


@pytest.mark.parametrize(
    ("weight_mode", "weight"),
    [
        ("sem", math.exp(-math.sqrt(0.2 / 2.5))),  # SEM = sqrt(v / max(N, 1))
        ("neff", math.exp(-math.sqrt(0.25 / 2.5))),  # sample size only: sqrt(V_prior / max(N, 1))
        ("sigma", math.exp(-math.sqrt(0.2))),  # dispersion only: sigma_k
        ("fixed", 0.5),
    ],
)
def test_each_weight_mode_on_an_all_correct_group(estimator_after_two_calls, weight_mode, weight):
    """Call 3: cluster 0 (N = 2.5, m1 = 0.75, v = 0.2) sees the all-correct group [1, 1].

    b = w*0.75 + (1 - w)*1, s = sqrt(w*0.2 + (1 - w)*0), A = (1 - b) / (s + eps) for both rows.
    """
    estimator = estimator_after_two_calls
    estimator.config = BVBlendConfig(gamma=0.5, n0=2.0, v_prior=0.25, temperature=1.0, weight_mode=weight_mode)
    advantages = run(estimator, [[1, 1]], [0], "call3")
    baseline = weight * 0.75 + (1 - weight) * 1.0
    expected = (1.0 - baseline) / (math.sqrt(weight * 0.2) + EPS)
    torch.testing.assert_close(advantages, torch.tensor([expected, expected]))
    assert estimator.metrics["bv_blend/weight_mean"] == pytest.approx(weight)
    assert estimator.metrics["bv_blend/effective_signal_ratio"] == 1.0
    assert estimator.metrics["bv_blend/grpo_signal_ratio"] == 0.0
    assert estimator.metrics["bv_blend/hist_var_mean"] == pytest.approx(0.2)


def test_singleton_group_with_and_without_history(estimator_after_two_calls):
    """[choice] A one-row group has mean R and std 0: 0 without history, w (R - m1) / sqrt(w v) with it."""
    fresh = BVBlendEstimator(num_clusters=2, config=BVBlendConfig(temperature=1.0))
    assert run(fresh, [[1.0]], [0], "s").tolist() == [0.0]

    weight = math.exp(-math.sqrt(0.2 / 2.5))
    advantage = run(estimator_after_two_calls, [[0.0]], [0], "s")
    expected = (0.0 - (weight * 0.75 + (1 - weight) * 0.0)) / (math.sqrt(weight * 0.2) + EPS)
    torch.testing.assert_close(advantage, torch.tensor([expected]))


def test_no_cluster_rows_are_prompt_local_and_only_age_the_history(estimator_after_two_calls):
    """Rows with c = -1 get w = 0 and add to no statistic, but the call still ages every cluster (spec 5.7)."""
    before = state_tensors(estimator_after_two_calls)
    advantages = run(estimator_after_two_calls, [[1, 1], [0, 1]], [-1, -1], "none")
    assert advantages[:2].tolist() == [0.0, 0.0]  # GRPO's collapse: no cluster, no history
    std = math.sqrt(0.5)
    torch.testing.assert_close(advantages[2:], torch.tensor([-0.5 / (std + EPS), 0.5 / (std + EPS)]))
    after = state_tensors(estimator_after_two_calls)
    torch.testing.assert_close(after["count"], before["count"] * 0.5)  # N' = gamma N + 0
    for name in ("mean", "second_moment", "seen"):
        assert torch.equal(before[name], after[name]), name
    assert estimator_after_two_calls.num_updates == 3


def test_padding_rows_get_zero_and_change_nothing(estimator_after_two_calls):
    reference = BVBlendEstimator(num_clusters=2, config=estimator_after_two_calls.config)
    reference.load_state_dict(estimator_after_two_calls.state_dict())
    expected = run(reference, [[1, 0, 1]], [0], "g")

    rewards, uids, clusters = batch_of_groups([[1, 0, 1]], [0], "g")
    # One padding row by verl's uid convention, one by an explicit mask; both with junk rewards.
    rewards = torch.cat([rewards[:1], torch.tensor([float("nan")]), rewards[1:], torch.tensor([7.0])])
    uids = np.array([uids[0], "pad0123", uids[1], uids[2], "g-0"], dtype=object)
    clusters = torch.tensor([0, 5, 0, 0, 1])
    valid = torch.tensor([True, True, True, True, False])
    advantages = estimator_after_two_calls.compute(rewards, uids, clusters, valid=valid)
    torch.testing.assert_close(advantages[[0, 2, 3]], expected, rtol=0, atol=0)
    assert advantages[[1, 4]].tolist() == [0.0, 0.0]
    for name, tensor in state_tensors(reference).items():
        assert torch.equal(tensor, state_tensors(estimator_after_two_calls)[name]), name


def test_token_level_face_treats_an_all_zero_mask_as_padding():
    estimator = BVBlendEstimator(num_clusters=1)
    token_rewards = torch.zeros(3, 4)
    token_rewards[:, -1] = torch.tensor([1.0, 0.0, 5.0])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
    uids = np.array(["a", "a", "a"], dtype=object)
    advantages, returns = estimator.compute_token_level(token_rewards, mask, uids, torch.tensor([0, 0, 0]))
    assert advantages.shape == mask.shape and torch.equal(advantages, returns)
    std = math.sqrt(0.5)
    torch.testing.assert_close(advantages[:, 0], torch.tensor([0.5 / (std + EPS), -0.5 / (std + EPS), 0.0]))
    assert state_tensors(estimator)["mean"].tolist() == [0.5]  # the padding row's reward 5 never counted


def test_mask_whose_first_token_is_zero_is_scanned_in_full():
    estimator = BVBlendEstimator(num_clusters=1)
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]], dtype=torch.float32)
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    advantages, _ = estimator.compute_token_level(token_rewards, mask, np.array(["a", "a"], dtype=object), [0, 0])
    assert advantages[0, 0] == 0 and advantages[0, 1] > 0 and advantages[1, 0] < 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_token_level_face_takes_the_mask_and_reward_dtypes_verl_uses(dtype):
    """numpy has no bfloat16, so the host copy of the mask must go through float32; int and bool masks as is."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]]).to(dtype)
    token_rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 9.0], [0.0, 0.0, 1.0]])
    if dtype.is_floating_point:
        token_rewards = token_rewards.to(dtype)
    uids = np.array(["a", "a", "a", "a"], dtype=object)
    advantages, _ = BVBlendEstimator(num_clusters=1).compute_token_level(token_rewards, mask, uids, [0, 0, 0, 0])
    reference, _ = BVBlendEstimator(num_clusters=1).compute_token_level(
        token_rewards.float(), mask.float(), uids, [0, 0, 0, 0]
    )
    assert advantages.dtype == torch.float32  # promoted from the 16-bit rewards, so nothing overflows
    torch.testing.assert_close(advantages, reference, rtol=0, atol=0)
    assert torch.equal(advantages[2], torch.zeros(3))  # the empty row is padding


def test_clip_bounds_the_advantage():
    estimator = BVBlendEstimator(num_clusters=1, config=BVBlendConfig(max_abs_advantage=0.5))
    advantages = run(estimator, [[1, 0, 0, 0]], [0], "a")
    assert advantages.abs().max() == 0.5
    assert estimator.metrics["bv_blend/abs_advantage_max"] == 0.5


def test_metrics_are_plain_floats_with_the_spec_names():
    estimator = BVBlendEstimator(num_clusters=3)
    run(estimator, [[1, 1], [0, 1], [0, 0]], [0, 1, 2], "a")
    assert set(estimator.metrics) == {
        "bv_blend/effective_signal_ratio", "bv_blend/grpo_signal_ratio", "bv_blend/zero_variance_group_ratio",
        "bv_blend/nonzero_advantage_ratio", "bv_blend/weight_mean", "bv_blend/cold_start_group_ratio",
        "bv_blend/clusters_seen", "bv_blend/hist_var_mean", "bv_blend/abs_advantage_max",
        "bv_blend/variance_floor_active_ratio",
    }
    assert all(type(value) is float for value in estimator.metrics.values())
    assert estimator.metrics["bv_blend/grpo_signal_ratio"] == pytest.approx(1 / 3)
    assert estimator.metrics["bv_blend/zero_variance_group_ratio"] == pytest.approx(2 / 3)
    assert estimator.metrics["bv_blend/nonzero_advantage_ratio"] == pytest.approx(2 / 6)
    assert estimator.metrics["bv_blend/clusters_seen"] == 3.0
