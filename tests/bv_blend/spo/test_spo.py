"""SPO's estimator (history_spec 2 and 6): the hand-computed sequence, the invariants, state and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bv_blend import SPOConfig, SPOEstimator
from bv_blend.history.keys import MissingPromptKeyError
from bv_blend.spo.estimator import offline_prior


def call(estimator, rewards, keys, groups=None, valid=None):
    rewards = torch.tensor(rewards, dtype=torch.float64)
    groups = np.arange(len(keys)) if groups is None else np.asarray(groups)
    return estimator.compute(rewards, groups, np.array(keys, dtype=object), valid=valid).numpy()


def tracker(estimator):
    rows = estimator.tracker.rows_of(estimator.tracker.keys)
    return dict(zip(estimator.tracker.keys, zip(estimator.tracker.values[0, rows], estimator.tracker.values[1, rows],
                                                strict=True), strict=True))  # fmt: skip


def test_the_hand_computed_two_call_sequence():
    """Spec 6. Call 1: prior 0.5 everywhere, a = r - 0.5 = (+-0.5), unbiased std sqrt(1/3), A = +-0.866.
    alpha, beta after: rho 0.5 + r, rho 0.5 + (1 - r) with rho = 0.875. Call 2 reads those: p^ = 1.4375 / 1.875."""
    spo = SPOEstimator()
    first = call(spo, [1, 0, 1, 0], ["a", "b", "c", "d"])
    np.testing.assert_allclose(first, [0.5, -0.5, 0.5, -0.5] / np.sqrt(1 / 3) / (1 + 1e-8 / np.sqrt(1 / 3)))
    assert spo.metrics["spo/p_hat_mean"] == 0.5 and spo.metrics["spo/first_visit_ratio"] == 1.0
    assert tracker(spo) == {"a": (1.4375, 0.4375), "b": (0.4375, 1.4375), "c": (1.4375, 0.4375), "d": (0.4375, 1.4375)}

    second = call(spo, [1, 1, 0, 0], ["a", "b", "c", "d"])
    p_hat = np.array([1.4375, 0.4375, 1.4375, 0.4375]) / 1.875
    before = np.array([1, 1, 0, 0]) - p_hat  # [0.2333, 0.7667, -0.7667, -0.2333]
    expected = (before - before.mean()) / (before.std(ddof=1) + 1e-8)
    np.testing.assert_allclose(second, expected, rtol=1e-12)
    assert spo.metrics["spo/adv_before_norm_mean"] == pytest.approx(before.mean(), abs=1e-15)
    assert spo.metrics["spo/adv_std"] == pytest.approx(before.std(ddof=1))
    assert spo.metrics["spo/n_eff_mean"] == pytest.approx(1.875)
    assert spo.metrics["spo/first_visit_ratio"] == 0.0 and spo.metrics["spo/prompts_tracked"] == 4
    assert tracker(spo)["a"] == pytest.approx((0.875 * 1.4375 + 1, 0.875 * 0.4375))
    assert tracker(spo)["d"] == pytest.approx((0.875 * 0.4375, 0.875 * 1.4375 + 1))


def test_one_visit_per_prompt_whatever_its_rows_and_no_decay_between_visits():
    spo = SPOEstimator()
    call(spo, [1, 1, 0, 1], ["a", "a", "a", "b"], groups=[0, 0, 0, 1])
    assert tracker(spo)["a"] == pytest.approx((0.875 * 0.5 + 2, 0.875 * 0.5 + 1))  # n = 3, R = 2: one visit
    for _ in range(50):  # other prompts only: "a" is left exactly as it was
        call(spo, [0, 1], ["x", "y"])
    assert tracker(spo)["a"] == pytest.approx((0.875 * 0.5 + 2, 0.875 * 0.5 + 1))


def test_one_valid_row_gets_its_centred_reward():
    spo = SPOEstimator()
    np.testing.assert_allclose(call(spo, [1.0], ["a"]), [0.5])


def test_offline_values_set_the_prior():
    alpha, beta = offline_prior([1, 1, 0, 1, 0, 0, 0, 1], weight=8.0)  # N = 8, sum 4: 8 * 4.5 / 9 each
    assert (alpha, beta) == pytest.approx((4.0, 4.0))
    spo = SPOEstimator(SPOConfig(), offline_values={"easy": [1] * 8})
    p_hat, known = spo.success_estimates(["easy", "other"])
    np.testing.assert_allclose(p_hat, [8 * 8.5 / 9 / 8, 0.5])  # alpha + beta = N_init = 8
    assert not known.any()
    assert call(spo, [1, 1], ["easy", "other"])[0] < 0  # a success on an easy prompt is below the batch's mean


def batches():
    return st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from([0.0, 1.0])), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(batches(), st.randoms(use_true_random=False))
def test_permuting_rows_permutes_the_advantages_and_padding_changes_nothing(rows, random):
    keys, rewards = [k for k, _ in rows], [r for _, r in rows]
    groups = [f"u{k}" for k in keys]  # one group per prompt key, as a step gives
    order = list(range(len(rows)))
    random.shuffle(order)
    plain, shuffled, padded = SPOEstimator(), SPOEstimator(), SPOEstimator()
    for estimator in (plain, shuffled, padded):
        call(estimator, [1.0, 0.0], ["a", "z"])  # some history first
    a = call(plain, rewards, keys, groups)
    b = call(shuffled, [rewards[i] for i in order], [keys[i] for i in order], [groups[i] for i in order])
    np.testing.assert_allclose(b, a[order], rtol=1e-12, atol=1e-12)
    valid = torch.tensor([True] * len(rows) + [False, False])
    c = call(padded, rewards + [float("nan"), 1.0], keys + [None, "pad"], groups + ["padx", "pady"], valid)
    np.testing.assert_array_equal(c[: len(rows)], a)
    assert (c[len(rows):] == 0).all()
    for other in (shuffled, padded):
        assert tracker(other) == tracker(plain)


def test_save_and_restore_mid_run_gives_the_same_advantages_bit_for_bit():
    rng = np.random.default_rng(0)
    calls = [([float(r) for r in rng.integers(0, 2, 6)], [f"p{k}" for k in rng.integers(0, 8, 6)]) for _ in range(8)]
    uninterrupted, first = SPOEstimator(), SPOEstimator()
    expected = [call(uninterrupted, r, k, groups=[f"g{i}" for i in range(6)]) for r, k in calls]
    for r, k in calls[:4]:
        call(first, r, k, groups=[f"g{i}" for i in range(6)])
    resumed = SPOEstimator()
    resumed.load_state_dict(first.state_dict())
    for (r, k), want in zip(calls[4:], expected[4:], strict=True):
        np.testing.assert_array_equal(call(resumed, r, k, groups=[f"g{i}" for i in range(6)]), want)


@pytest.mark.parametrize(
    ("rewards", "keys", "match"),
    [
        ([1.5, 0.0], ["a", "b"], r"Rewards must lie in \[0, 1\] \(SPO's tracker is a Beta posterior.*"
                                 r"reward.custom_reward_function.path"),
        ([-0.2, 0.0], ["a", "b"], r"rows \[0\]"),
        ([float("nan"), 0.0], ["a", "b"], "must be finite"),
        ([1.0, 0.0], ["a", None], "have no prompt key"),
        ([1.0, 0.0], ["a", ""], "have no prompt key"),
    ],
)
def test_bad_input_is_a_clear_error_and_the_tracker_is_unchanged(rewards, keys, match):
    spo = SPOEstimator()
    call(spo, [1.0, 0.0], ["a", "b"])
    before, metrics = tracker(spo), dict(spo.metrics)
    with pytest.raises(ValueError, match=match):
        call(spo, rewards, keys)
    assert tracker(spo) == before and spo.metrics == metrics and spo.num_updates == 1


def test_a_group_whose_rows_carry_different_keys_is_refused():
    with pytest.raises(ValueError, match="A prompt group mixes prompt keys 'a' and 'b'"):
        call(SPOEstimator(), [1.0, 0.0], ["a", "b"], groups=[0, 0])


def test_missing_prompt_key_error_is_a_value_error():
    assert issubclass(MissingPromptKeyError, ValueError)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda s: s.update(format_version=9), "Unsupported SPO state format 9"),
        (lambda s: s["config"].update(rho=0.5), "was made with another config"),
        (lambda s: s["tracker"].update(alpha=torch.tensor([-1.0, 1.0], dtype=torch.float64)), "alpha or beta <= 0"),
        (lambda s: s["tracker"].update(keys=["a", "a"]), "distinct prompt keys"),
    ],
)
def test_a_corrupt_state_is_refused_before_anything_changes(mutate, match):
    saved = SPOEstimator()
    call(saved, [1.0, 0.0], ["a", "b"])
    state = saved.state_dict()
    mutate(state)
    fresh = SPOEstimator()
    with pytest.raises(ValueError, match=match):
        fresh.load_state_dict(state)
    assert len(fresh.tracker) == 0 and fresh.num_updates == 0


def test_config_is_validated_by_name():
    with pytest.raises(ValueError, match=r"algorithm.spo.rho=0.0 is invalid"):
        SPOConfig(rho=0.0)
    with pytest.raises(ValueError, match=r"Unknown option\(s\) algorithm.spo.\{rhoo\}"):
        SPOConfig.from_mapping({"rhoo": 0.9})


def test_the_reward_range_error_names_only_settings_that_exist():
    """SPO's [0, 1] is fixed (a Beta posterior): the error says why and what to change, not an option SPO lacks."""
    with pytest.raises(ValueError) as error:
        call(SPOEstimator(), [2.0, 0.0], ["a", "b"])
    assert "algorithm.spo.reward_range" not in str(error.value) and "Beta posterior" in str(error.value)
    assert "reward_range" not in SPOConfig().to_dict()


def test_float_noise_at_the_ends_of_the_range_is_taken_as_the_end():
    """A float32 reward of 1 summed over token rewards can land a few ulps above 1, which the range check lets through
    (1e-6 of its width): it is clipped, so the tracker and the advantages are those of exactly 0 and 1 (unclipped,
    beta's update rho beta + n - R went below rho beta on that row)."""
    noisy, exact = SPOEstimator(), SPOEstimator()
    for rewards in ([1 + 5e-7, -4e-7, 1.0, 0.0], [1.0, 1 + 9e-7, 0.0, 0.0]):
        clean = np.clip(rewards, 0.0, 1.0).tolist()
        np.testing.assert_array_equal(call(noisy, rewards, ["a", "b", "c", "d"]),
                                      call(exact, clean, ["a", "b", "c", "d"]))
    assert tracker(noisy) == tracker(exact)
    with pytest.raises(ValueError, match=r"Rewards must lie in \[0, 1\]"):
        call(noisy, [1.01, 0.0], ["a", "b"])
