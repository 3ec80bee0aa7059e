"""MaxNorm-AC with the RRP (companions spec section 3): the worked table, binning, edge cases, parity with verl."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from bv_blend.companions import MaxNormAC, MaxNormConfig, bin_rewards
from tests.bv_blend.companions._helpers import groups, sequence, token_level, with_padding

THIRD = 1 / 3


def maxnorm(rewards, numerator="rloo", **options):
    """Advantages of one group and the estimator (for its metrics)."""
    estimator = MaxNormAC(MaxNormConfig(numerator=numerator, **options))
    return estimator.compute(*groups([rewards])), estimator


def verl_estimator(name, rewards):
    rewards_, uids = groups([rewards])
    token_rewards, mask = token_level(rewards_)
    advantages, _ = get_adv_estimator_fn(name)(token_level_rewards=token_rewards, response_mask=mask, index=uids)
    return sequence(advantages, mask).double()


# -------------------------------------------------------------------------------------------- worked table
@pytest.mark.parametrize("numerator", ["rloo", "centered"])
@pytest.mark.parametrize(
    ("rewards", "rloo", "centered"),
    [
        ([0.51, 0.50, 0.49, 0.50], [1, 0, -1, 0], [1, 0, -1, 0]),
        ([0.503, 0.501, 0.499, 0.500], [0, 0, 0, 0], [0, 0, 0, 0]),
        ([0.01, 0.01, 0, 0], [2 / 3, 2 / 3, -2 / 3, -2 / 3], [0.5, 0.5, -0.5, -0.5]),
        ([1, 0, 0, 0], [1, -THIRD, -THIRD, -THIRD], [1, -THIRD, -THIRD, -THIRD]),
        ([0.7], [0], [0]),
    ],
    ids=["resolved", "jitter_skipped", "floor_binds", "one_right", "singleton"],
)
def test_worked_table(numerator, rewards, rloo, centered):
    advantages, _ = maxnorm(rewards, numerator)
    expected = rloo if numerator == "rloo" else centered
    torch.testing.assert_close(advantages, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def test_worked_table_verl_column():
    """The "verl for comparison" column, computed by verl itself: GRPO amplifies the sub-resolution jitter."""
    column = {
        ("grpo", (0.51, 0.50, 0.49, 0.50)): [1.2246, 0, -1.2246, 0],
        ("rloo", (0.51, 0.50, 0.49, 0.50)): [0.0133, 0, -0.0133, 0],
        ("grpo", (0.503, 0.501, 0.499, 0.500)): [1.3167, 0.1463, -1.0241, -0.4389],
    }
    for (name, rewards), expected in column.items():
        actual = verl_estimator(name, list(rewards))
        torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float64), atol=1e-4, rtol=0)
    # The singleton quirk: verl's rloo returns R, rloo_vectorized 0 (MaxNorm: 0, skipped).
    assert verl_estimator("rloo", [0.7]).item() == pytest.approx(0.7)
    assert verl_estimator("rloo_vectorized", [0.7]).item() == 0


def test_worked_table_metrics():
    _, resolved = maxnorm([0.51, 0.50, 0.49, 0.50])
    assert resolved.metrics["maxnorm/skipped_group_ratio"] == 0
    assert resolved.metrics["maxnorm/floor_active_ratio"] == 0
    assert resolved.metrics["maxnorm/inv_scale_max"] == pytest.approx(75.0)  # s = 0.04 / 3
    assert resolved.metrics["maxnorm/abs_advantage_max"] == pytest.approx(1.0)
    assert resolved.metrics["maxnorm/binning_changed_ratio"] == 0

    _, jitter = maxnorm([0.503, 0.501, 0.499, 0.500])
    assert jitter.metrics["maxnorm/skipped_group_ratio"] == 1
    assert jitter.metrics["maxnorm/abs_advantage_max"] == 0
    assert jitter.metrics["maxnorm/binning_changed_ratio"] == 0.75  # 0.500 is on the grid already
    std = float(np.std([0.503, 0.501, 0.499, 0.500], ddof=1))
    assert jitter.metrics["maxnorm/grpo_inv_std_p95"] == pytest.approx(1 / (std + 1e-6))  # about 585

    _, floored = maxnorm([0.01, 0.01, 0, 0])
    assert floored.metrics["maxnorm/floor_active_ratio"] == 1
    assert floored.metrics["maxnorm/inv_scale_max"] == pytest.approx(100.0)  # 1 / tau


def test_metrics_over_a_mixed_batch():
    estimator = MaxNormAC()
    estimator.compute(*groups([[1, 0, 0, 0], [0.503, 0.501, 0.499, 0.5], [0.01, 0.01, 0, 0], [0.4], [0.3, 0.3]]))
    metrics = estimator.metrics
    assert metrics["maxnorm/skipped_group_ratio"] == pytest.approx(3 / 5)  # jitter, singleton, all-equal
    assert metrics["maxnorm/floor_active_ratio"] == pytest.approx(1 / 2)  # of the two groups with a scale
    assert metrics["maxnorm/inv_scale_mean"] == pytest.approx((1 + 100) / 2)
    assert metrics["maxnorm/inv_scale_max"] == pytest.approx(100.0)


# ------------------------------------------------------------------------------------------------- binning
def test_binning_rounds_half_up_where_torch_round_would_not():
    rewards = np.array([0.505, 0.515, 0.525, 0.004999, 0.005, 0.995, 1.0, 0.0])
    binned, _ = bin_rewards(rewards, 0.01, (0.0, 1.0))
    np.testing.assert_allclose(binned, [0.51, 0.52, 0.53, 0.0, 0.01, 1.0, 1.0, 0.0], rtol=0, atol=1e-12)
    # Half to even (torch.round, np.round) sends 0.505 and 0.525 down: the test above tells the two apart.
    assert torch.round(torch.tensor(50.5)).item() == 50 and torch.round(torch.tensor(52.5)).item() == 52


def test_the_guard_rounds_up_halves_that_float_division_leaves_a_hair_below():
    """0.145 / 0.01 = 14.499999999999998: without the 1e-9 guard, floor(x + 1/2) would give 14, not 15."""
    halves = np.array([0.145, 0.235, 0.285, 0.295, 0.565, 0.575, 0.585, 0.595])
    assert (np.floor(halves / 0.01 + 0.5) < np.floor(halves * 100 + 1e-6 + 0.5)).all()  # the float trap
    binned, _ = bin_rewards(halves, 0.01, (0.0, 1.0))
    np.testing.assert_allclose(binned, halves + 0.005, rtol=0, atol=1e-12)


def test_binning_is_bounded_by_the_range():
    binned, _ = bin_rewards(np.array([1.0, 0.85, 0.75, -0.0]), 0.4, (0.0, 1.0))
    np.testing.assert_allclose(binned, [1.0, 0.8, 0.8, 0.0])  # grid 0, 0.4, 0.8, (1.2 pulled back to 1)
    shifted, _ = bin_rewards(np.array([-1.0, -0.996, 0.004]), 0.01, (-1.0, 1.0))
    np.testing.assert_allclose(shifted, [-1.0, -1.0, 0.0], atol=1e-12)  # the grid starts at lo


def test_binning_off_keeps_rewards():
    rewards = np.array([0.503, 0.501])
    binned, key = bin_rewards(rewards, 0.0, (0.0, 1.0))
    np.testing.assert_array_equal(binned, rewards)
    np.testing.assert_array_equal(key, rewards)


# ------------------------------------------------------------------------------------------------ edge cases
def test_skip_zero_gap_off_changes_only_what_counts_as_skipped():
    batch = groups([[0.503, 0.501, 0.499, 0.5], [1, 0], [0.2]])
    on, off = MaxNormAC(), MaxNormAC(MaxNormConfig(skip_zero_gap=False))
    assert torch.equal(on.compute(*batch), off.compute(*batch))
    assert on.metrics["maxnorm/skipped_group_ratio"] == pytest.approx(2 / 3)
    assert off.metrics["maxnorm/skipped_group_ratio"] == pytest.approx(1 / 3)  # the singleton only


def test_all_equal_groups_are_exactly_zero_even_without_a_floor():
    """An all-equal group's numerator is 0 in exact arithmetic; float noise must not be scaled up to +-1."""
    advantages, _ = maxnorm([0.1, 0.1, 0.1], delta_res=0.0, tau_res=0.0)
    assert torch.count_nonzero(advantages) == 0


def test_padding_rows_by_uid_and_by_mask_change_nothing():
    rewards, uids = groups([[1, 0, 0, 0], [0.51, 0.5, 0.49], [0.2, 0.3]])
    clean = MaxNormAC()
    expected = clean.compute(rewards, uids)
    padded = MaxNormAC()
    actual = padded.compute(*with_padding(rewards, uids, 3))
    assert torch.equal(actual[: len(uids)], expected) and torch.count_nonzero(actual[len(uids) :]) == 0
    assert padded.metrics == clean.metrics

    extra_rewards = torch.cat([rewards, torch.tensor([0.9, 7.0], dtype=torch.float64)])
    extra_uids = np.concatenate([uids, np.array(["uid-0", "lonely"], dtype=object)])
    token_rewards, mask = token_level(extra_rewards, seed=5)
    mask[-2:] = 0  # a padding row inside a real group, and one out of range: both ignored
    masked = MaxNormAC()
    advantages, returns = masked.compute_token_level(token_rewards, mask, extra_uids)
    assert torch.equal(advantages, returns)
    torch.testing.assert_close(sequence(advantages, mask)[: len(uids)], expected, rtol=1e-12, atol=1e-12)
    assert torch.count_nonzero(advantages[-2:]) == 0


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (1.2, r"Rewards must lie in algorithm.maxnorm.reward_range=\[0, 1\]; rows \[1\] hold \[1.2\]"),
        (float("nan"), r"Rewards must be finite; rows \[1\]"),
    ],
)
def test_bad_rewards_raise_a_clear_error(reward, message):
    estimator = MaxNormAC()
    estimator.compute(*groups([[1, 0]]))
    before = dict(estimator.metrics)
    rewards, uids = groups([[1, 0, 0]])
    rewards[1] = reward
    with pytest.raises(ValueError, match=message):
        estimator.compute(rewards, uids)
    assert estimator.metrics == before


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"numerator": "grpo"}, "must be one of rloo, centered"),
        ({"delta_res": -0.01}, r"must be in \[0, hi - lo = 1\]"),
        ({"delta_res": 2.0}, r"must be in \[0, hi - lo = 1\]"),
        ({"tau_res": -1.0}, "tau_res=-1.0 is invalid"),
        ({"reward_range": (0, 0)}, "finite lo < hi"),
        ({"skip_zero_gap": 1}, "must be true or false"),
    ],
)
def test_config_validation_names_the_option(options, message):
    with pytest.raises(ValueError, match=message):
        MaxNormConfig(**options)


def test_config_defaults_and_mapping():
    config = MaxNormConfig()
    assert (config.numerator, config.delta_res, config.floor, config.reward_range, config.skip_zero_gap) == (
        "rloo",
        0.01,
        0.01,
        (0.0, 1.0),
        True,
    )
    assert MaxNormConfig(tau_res=0.05).floor == 0.05
    with pytest.raises(ValueError, match=r"algorithm.maxnorm.\{delta\}"):
        MaxNormConfig.from_mapping({"delta": 0.01})


# ------------------------------------------------------------------------------------------ parity with verl
@pytest.mark.parametrize("seed", range(8))
def test_binning_off_and_no_floor_is_rloo_vectorized_over_its_group_max(seed):
    generator = np.random.default_rng(seed)
    group_rewards = [generator.uniform(0, 1, generator.integers(1, 9)).tolist() for _ in range(12)]
    group_rewards.append([0.25, 0.25, 0.25])  # all equal: rloo_vectorized gives 0, so do we
    rewards, uids = groups(group_rewards, f"p{seed}")
    order = torch.from_numpy(generator.permutation(len(uids)))
    rewards, uids = rewards[order], uids[order.numpy()]
    token_rewards, mask = token_level(rewards, seed=seed)
    rloo, _ = get_adv_estimator_fn("rloo_vectorized")(token_level_rewards=token_rewards, response_mask=mask, index=uids)
    rloo = sequence(rloo, mask)
    group_max = {uid: rloo[uids == uid].abs().max() for uid in set(uids)}
    denominator = torch.stack([group_max[uid] for uid in uids])
    expected = torch.where(denominator > 0, rloo / denominator.clamp_min(1e-300), torch.zeros_like(rloo))
    actual, _ = MaxNormAC(MaxNormConfig(delta_res=0.0, tau_res=0.0)).compute_token_level(token_rewards, mask, uids)
    torch.testing.assert_close(sequence(actual, mask), expected, rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------------------------------------ properties
rewards_in_range = st.floats(0, 1, allow_nan=False, allow_subnormal=False)
batches = st.lists(st.lists(rewards_in_range, min_size=1, max_size=8), min_size=1, max_size=8)
configs = st.builds(
    MaxNormConfig,
    numerator=st.sampled_from(["rloo", "centered"]),
    delta_res=st.sampled_from([0.0, 0.01, 0.1, 0.25]),
    tau_res=st.sampled_from([None, 0.0, 0.01, 0.5]),
)


@settings(max_examples=150, deadline=None)
@given(group_rewards=batches, config=configs)
def test_advantages_are_bounded_by_one_and_keep_order_within_groups(group_rewards, config):
    rewards, uids = groups(group_rewards)
    advantages = MaxNormAC(config).compute(rewards, uids)
    assert torch.isfinite(advantages).all() and advantages.abs().max() <= 1 + 1e-12
    binned, _ = bin_rewards(rewards.numpy(), config.delta_res, config.reward_range)
    for uid in set(uids):
        rows = uids == uid
        # Within a group, a higher binned reward never gets a lower advantage.
        order = np.argsort(binned[rows], kind="stable")
        assert (np.diff(advantages[rows].numpy()[order]) >= -1e-12).all()


@settings(max_examples=100, deadline=None)
@given(group_rewards=batches, delta=st.sampled_from([0.0, 0.01, 0.1]))
def test_numerators_agree_unless_the_floor_binds(group_rewards, delta):
    rewards, uids = groups(group_rewards)
    rloo = MaxNormAC(MaxNormConfig(delta_res=delta, tau_res=0.0)).compute(rewards, uids)
    centered = MaxNormAC(MaxNormConfig(numerator="centered", delta_res=delta, tau_res=0.0)).compute(rewards, uids)
    torch.testing.assert_close(rloo, centered, rtol=1e-9, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(group_rewards=batches, seed=st.integers(0, 2**31 - 1), pads=st.integers(0, 3))
def test_permutation_equivariance_and_padding_inertness(group_rewards, seed, pads):
    rewards, uids = groups(group_rewards)
    expected = MaxNormAC().compute(rewards, uids)
    padded_rewards, padded_uids = with_padding(rewards, uids, pads, junk=9.0)
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(padded_uids)))
    actual = MaxNormAC().compute(padded_rewards[order], padded_uids[order.numpy()])
    full = torch.cat([expected, torch.zeros(pads, dtype=expected.dtype)])
    torch.testing.assert_close(actual, full[order], rtol=1e-12, atol=1e-12)
