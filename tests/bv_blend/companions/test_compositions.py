"""Compositions with BV-Blend (companions spec section 4): the bounded scale, and the refusals with their reasons
(declared in the estimators' records, bv_blend/verl/records.py)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bv_blend.blend.estimator import bounded_blend_scale
from bv_blend.verl.compositions import Composition, check_composition

EPS = 1e-6


def grpo_stats(group_rewards):
    """Rewards, codes, and GRPO's baseline and scale per group (BV-Blend with w = 0)."""
    rewards = np.concatenate([np.asarray(g, dtype=np.float64) for g in group_rewards])
    codes = np.repeat(np.arange(len(group_rewards)), [len(g) for g in group_rewards])
    baseline = np.array([np.mean(g) for g in group_rewards])
    scale = np.array([np.std(g, ddof=1) if len(g) > 1 else 0.0 for g in group_rewards])
    return rewards, codes, baseline, scale


def test_one_right_out_of_eight_is_bounded_from_2_47_to_1():
    rewards, codes, baseline, scale = grpo_stats([[1] + [0] * 7])
    assert (1 - baseline[0]) / scale[0] == pytest.approx(2.4749, abs=1e-4)  # GRPO's value
    bounded = bounded_blend_scale(rewards, codes, baseline, scale, tau=0.01)
    np.testing.assert_allclose(bounded, [0.875])  # max |R - b| = 7/8 exceeds s_BV = 0.354
    assert (1 - baseline[0]) / bounded[0] == pytest.approx(1.0)


def test_where_tau_does_not_bind_it_is_a_bv_divided_by_max_one_and_its_largest():
    """A^BV / max(1, max_j |A^BV_j|), with BV-Blend-like scales (history makes s_BV differ from the group's std)."""
    rewards, codes, baseline, _ = grpo_stats([[1, 0, 0, 0], [1, 1, 1, 1], [0.2, 0.8], [1, 0, 1, 1]])
    baseline = baseline + np.array([0.1, -0.3, 0.0, 0.05])  # blended toward a cluster mean
    scale = np.array([0.3, 0.4, 2.0, 0.6])
    bounded = bounded_blend_scale(rewards, codes, baseline, scale, tau=0.0)
    advantage_bv = (rewards - baseline[codes]) / scale[codes]
    largest = np.array([np.abs(advantage_bv[codes == g]).max() for g in range(4)])
    expected = advantage_bv / np.maximum(1.0, largest)[codes]
    np.testing.assert_allclose((rewards - baseline[codes]) / bounded[codes], expected, rtol=1e-12)


def test_tau_floors_the_scale_and_padding_rows_do_not_count():
    rewards = np.array([0.5, 0.5, 9.0])
    codes = np.array([0, 0, 0])
    valid = np.array([True, True, False])
    bounded = bounded_blend_scale(rewards, codes, np.array([0.5]), np.array([0.0]), tau=0.01, valid=valid)
    np.testing.assert_allclose(bounded, [0.01])
    unmasked = bounded_blend_scale(rewards, codes, np.array([0.5]), np.array([0.0]), tau=0.01)
    np.testing.assert_allclose(unmasked, [8.5])  # what the mask prevents


@pytest.mark.parametrize("tau", [-0.1, float("nan"), float("inf")])
def test_tau_is_validated(tau):
    with pytest.raises(ValueError, match="tau="):
        bounded_blend_scale(np.zeros(2), np.zeros(2, dtype=int), np.zeros(1), np.zeros(1), tau=tau)


def test_baseline_and_scale_must_be_one_per_group():
    with pytest.raises(ValueError, match="one per group"):
        bounded_blend_scale(np.zeros(2), np.zeros(2, dtype=int), np.zeros(1), np.zeros(2), tau=0.0)


group_lists = st.lists(
    st.lists(st.floats(0, 1, allow_nan=False, allow_subnormal=False), min_size=1, max_size=6), min_size=1, max_size=6
)


@settings(max_examples=150, deadline=None)
@given(
    group_rewards=group_lists,
    shift=st.floats(-1, 1),
    scale=st.floats(0, 3),
    tau=st.sampled_from([0.0, 0.01, 0.5]),
)
def test_bounded_advantages_never_exceed_one(group_rewards, shift, scale, tau):
    rewards, codes, baseline, _ = grpo_stats(group_rewards)
    baseline = baseline + shift
    scales = np.full(len(group_rewards), scale)
    bounded = bounded_blend_scale(rewards, codes, baseline, scales, tau)
    advantage = (rewards - baseline[codes]) / (bounded[codes] + EPS)
    assert np.all(np.abs(advantage) <= 1.0)
    assert np.all(bounded >= np.maximum(scales, tau))


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("composition", "reason"),
    [
        (Composition("bv_blend", reward_binning=True, skip_zero_gap=True), "deletes exactly the groups BV-Blend"),
        (Composition("maxnorm_ac", difficulty_weighting=True), r"breaks the bound \|A\| <= 1"),
        (Composition("bv_blend", difficulty_weighting=True), "partly cancel"),
        (Composition("maxnorm_ac", use_kl_in_reward=True), "leave the reward grid"),
        (Composition("maxnorm_ac", bounded_scale=True), "bounded_scale is an option of bv_blend"),
        (Composition("grpo", reward_binning=True), "has no RRP stage"),
    ],
)
def test_unsound_compositions_are_refused_with_the_reason(composition, reason):
    with pytest.raises(ValueError, match=f"Unsound combination for {composition.estimator}") as error:
        check_composition(composition)
    assert error.match(reason)


def test_every_reason_is_reported_at_once():
    with pytest.raises(ValueError) as error:
        check_composition(Composition("maxnorm_ac", difficulty_weighting=True, use_kl_in_reward=True))
    assert str(error.value).count("\n- ") == 2


@pytest.mark.parametrize(
    "composition",
    [
        Composition("bv_blend"),
        Composition("bv_blend", reward_binning=True, bounded_scale=True),  # RRP binning before BV-Blend: sound
        Composition("maxnorm_ac", reward_binning=True, skip_zero_gap=True),
        Composition("ha_dw"),
        Composition("grpo", use_kl_in_reward=True),
    ],
)
def test_sound_compositions_pass(composition):
    check_composition(composition)


def test_bounded_bv_blend_is_the_blend_divided_by_its_largest_magnitude():
    """Spec 4: where tau does not bind, bounded BV-Blend = A^BV / max(1, max_j |A^BV_j|) per group, over calls with
    history (w > 0), and the history is folded in exactly as without the bound."""
    from bv_blend import BVBlendConfig, BVBlendEstimator

    rng = np.random.default_rng(0)
    plain = BVBlendEstimator(3, BVBlendConfig(max_abs_advantage=None))
    bounded = BVBlendEstimator(3, BVBlendConfig(max_abs_advantage=None, bounded_scale_tau=0.0))
    groups = np.repeat(np.arange(6), 4)
    for _ in range(5):
        rewards = torch.tensor((rng.random(groups.size) < 0.4).astype(float), dtype=torch.float64)
        clusters = torch.tensor(groups % 3)
        a, b = plain.compute(rewards, groups, clusters).numpy(), bounded.compute(rewards, groups, clusters).numpy()
        largest = np.array([np.abs(a[groups == g]).max() for g in groups])
        np.testing.assert_allclose(b, a / np.maximum(1.0, largest), rtol=1e-5, atol=1e-9)
        assert np.abs(b).max() <= 1.0 + 1e-9
    for name, tensor in plain.moments.state_dict().items():
        torch.testing.assert_close(bounded.moments.state_dict()[name], tensor, rtol=0, atol=0)
