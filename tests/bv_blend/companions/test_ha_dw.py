"""HA-DW (companions spec section 2): the worked examples, the anchor state, edge cases and parity with verl's grpo."""

import io
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from bv_blend.companions import HADWConfig, HADWEstimator
from tests.bv_blend.companions._helpers import groups, sequence, token_level, with_padding

WORKED = [[1, 0, 0, 0], [1, 1, 1, 0]]


def estimator_with_history(history, **options) -> HADWEstimator:
    """An estimator whose anchor state is ``history``, set through the public state API."""
    estimator = HADWEstimator(HADWConfig(**options))
    state = estimator.state_dict()
    state["history"] = torch.tensor(history, dtype=torch.float64)
    estimator.load_state_dict(state)
    return estimator


def same_state(left: HADWEstimator, right: HADWEstimator) -> bool:
    return torch.equal(left.state_dict()["history"], right.state_dict()["history"]) and (
        left.num_updates == right.num_updates
    )


# ------------------------------------------------------------------------------------------- worked examples
@pytest.mark.parametrize(
    ("epsilon", "big", "small"), [(1e-6, 2.503845, 0.506219), (0.0, 2.503849, 0.506221)], ids=["verl_eps", "eps0"]
)
@pytest.mark.parametrize("route", ["first_call", "stored_anchor"])
def test_worked_example_hard_and_easy_group(epsilon, big, small, route):
    """lambda = 1.3, a = 0.5, G = 4. A fresh estimator uses a = y_t = 0.5; a stored window [0.5] gives the same.

    The spec prints 6 decimals (its 2.503849 is 2.50384956..., cut rather than rounded), hence atol 1e-6; the two
    epsilon variants differ by 4.4e-6, so the test still tells them apart.
    """
    estimator = HADWEstimator(HADWConfig(epsilon=epsilon)) if route == "first_call" else (
        estimator_with_history([0.5], epsilon=epsilon)
    )
    advantages = estimator.compute(*groups(WORKED))
    expected = torch.tensor([big, -small, -small, -small, small, small, small, -big], dtype=torch.float64)
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-6)
    assert estimator.metrics["ha_dw/batch_acc"] == 0.5
    assert estimator.metrics["ha_dw/anchor"] == 0.5
    assert estimator.metrics["ha_dw/hard_group_ratio"] == 0.5
    assert estimator.metrics["ha_dw/easy_group_ratio"] == 0.5
    assert estimator.metrics["ha_dw/phi_max"] == pytest.approx(1.3 * math.exp(0.25))  # 1.669233
    assert estimator.metrics["ha_dw/phi_min"] == pytest.approx(1.3 * math.exp(-0.25))  # 1.012441
    assert estimator.metrics["ha_dw/abs_advantage_max"] == pytest.approx(big, abs=1e-6)
    assert "ha_dw/eta" not in estimator.metrics  # window mode has no gain


def test_worked_example_phi_of_each_row():
    """The correct row of the hard group is pushed up (D = +1), its wrong rows less down (D = -1)."""
    estimator = estimator_with_history([0.5])
    advantages = estimator.compute(*groups(WORKED))
    grpo = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -1.5], dtype=torch.float64) / (1 + 2e-6)
    phi = advantages / grpo
    expected = [1.669233, 1.012441, 1.012441, 1.012441, 1.012441, 1.012441, 1.012441, 1.669233]
    torch.testing.assert_close(phi, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=2e-6)


@pytest.mark.parametrize(("anchor", "used"), [("prior", 0.5), ("with_current", 0.48)])
def test_kalman_worked_example(anchor, used):
    """Stored C+ = [0.3, 0.5], C- = 0.5, y = 0.3: sigma = 0.1, eta_t = 0.1, C+ = 0.48."""
    estimator = estimator_with_history([0.3, 0.5], mode="kalman", anchor=anchor)
    assert estimator.anchor == 0.5
    estimator.compute(*groups([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]))  # y = 3 / 10
    assert estimator.metrics["ha_dw/batch_acc"] == pytest.approx(0.3)
    assert estimator.metrics["ha_dw/eta"] == pytest.approx(0.1)
    assert estimator.anchor == pytest.approx(0.48)
    assert estimator.metrics["ha_dw/anchor"] == pytest.approx(used)
    np.testing.assert_allclose(estimator.history, [0.3, 0.5, 0.48])


def test_kalman_first_call_sets_the_prior_to_y_and_eta_min_keeps_it_moving():
    estimator = HADWEstimator(HADWConfig(mode="kalman", belief_window=3, eta=5.0))
    estimator.compute(*groups([[1, 1, 1, 1]]))  # y_1 = 1: C- = y_1, sigma = 0 -> eta_min, C+ = y_1
    assert estimator.anchor == 1.0 and estimator.metrics["ha_dw/eta"] == 0.05
    estimator.compute(*groups([[1, 1, 1, 1]]))  # one stored posterior: sigma = 0 again
    estimator.compute(*groups([[0, 0, 0, 0]]))  # [1, 1] stored: sigma = 0, so the literal Eq. 8-11 would freeze
    assert estimator.metrics["ha_dw/eta"] == 0.05
    assert estimator.anchor == pytest.approx(0.95)
    estimator.compute(*groups([[0, 0, 0, 0]]))  # [1, 1, 0.95] stored: sigma > 0, eta_t = 5 sigma > eta_min
    gain = 5.0 * float(np.std([1.0, 1.0, 0.95]))
    assert estimator.metrics["ha_dw/eta"] == pytest.approx(gain)
    assert estimator.anchor == pytest.approx((1 - gain) * 0.95)
    assert estimator.history.size == 3  # m = 3 posteriors kept


def test_window_anchor_is_the_mean_of_the_last_h_accuracies():
    prior = HADWEstimator(HADWConfig(window=2))
    current = HADWEstimator(HADWConfig(window=2, anchor="with_current"))
    accuracies = []
    for batch in ([[1, 1, 1, 1]], [[0, 0, 0, 0]], [[1, 0, 0, 0]], [[1, 1, 0, 0]]):
        expected_prior = float(np.mean(accuracies[-2:])) if accuracies else float(np.mean(batch))
        accuracies.append(float(np.mean(batch)))
        prior.compute(*groups(batch))
        current.compute(*groups(batch))
        assert prior.metrics["ha_dw/anchor"] == pytest.approx(expected_prior)
        assert current.metrics["ha_dw/anchor"] == pytest.approx(np.mean(accuracies[-2:]))
    np.testing.assert_allclose(prior.history, [0.25, 0.5])


def test_dr_grpo_mode_weights_the_centred_reward():
    estimator = estimator_with_history([0.5], norm_adv_by_std=False)
    advantages = estimator.compute(*groups(WORKED))
    up, down = 1.3 * math.exp(0.25), 1.3 * math.exp(-0.25)
    expected = [0.75 * up, -0.25 * down, -0.25 * down, -0.25 * down, 0.25 * down, 0.25 * down, 0.25 * down, -0.75 * up]
    torch.testing.assert_close(advantages, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)


def test_rewards_are_divided_by_the_range_width():
    """0/10 rewards give the same advantages as 0/1 rewards: diff is measured in units of the range."""
    unit = estimator_with_history([0.5], epsilon=0.0).compute(*groups(WORKED))
    tenfold = estimator_with_history([5.0], epsilon=0.0, reward_range=[0, 10])
    rewards, uids = groups(WORKED)
    torch.testing.assert_close(tenfold.compute(rewards * 10, uids), unit, rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------------------------ edge cases
def test_singletons_keep_grpo_value_and_zero_variance_groups_stay_zero():
    estimator = estimator_with_history([0.9])
    advantages = estimator.compute(*groups([[1.0], [0.0], [1, 1, 1], [0, 0]]))
    torch.testing.assert_close(advantages[:2], torch.tensor([1 / (1 + 1e-6), 0.0], dtype=torch.float64))
    assert torch.count_nonzero(advantages[2:]) == 0
    assert estimator.metrics["ha_dw/phi_mean"] == 1.0  # no row was reweighted
    assert estimator.metrics["ha_dw/batch_acc"] == pytest.approx(4 / 7)  # singletons count in y_t
    dr = estimator_with_history([0.9], norm_adv_by_std=False).compute(*groups([[1.0], [0.25]], "dr"))
    torch.testing.assert_close(dr, torch.tensor([1.0, 0.25], dtype=torch.float64))


def test_padding_rows_by_uid_and_by_mask_change_nothing():
    rewards, uids = groups(WORKED + [[1, 0, 1]])
    reference = estimator_with_history([0.4])
    expected = reference.compute(rewards, uids)

    padded = estimator_with_history([0.4])
    junk_rewards, junk_uids = with_padding(rewards, uids, 3, junk=float("nan"))
    advantages = padded.compute(junk_rewards, junk_uids)
    torch.testing.assert_close(advantages[: len(rewards)], expected, rtol=0, atol=0)
    assert torch.count_nonzero(advantages[len(rewards) :]) == 0
    assert same_state(padded, reference) and padded.metrics == reference.metrics

    # Token face: rows with an all-zero response mask are padding too, whatever their uid and reward.
    masked = estimator_with_history([0.4])
    extra_rewards = torch.cat([rewards, torch.tensor([7.0, 1.0])])
    extra_uids = np.concatenate([uids, np.array(["uid-0", "fresh"], dtype=object)])
    token_rewards, mask = token_level(extra_rewards, seed=3)
    mask[-2:] = 0
    token_advantages, returns = masked.compute_token_level(token_rewards, mask, extra_uids)
    assert torch.equal(token_advantages, returns)
    torch.testing.assert_close(sequence(token_advantages, mask)[: len(rewards)], expected, rtol=1e-12, atol=1e-12)
    assert torch.count_nonzero(token_advantages[-2:]) == 0
    assert same_state(masked, reference)


def test_a_call_without_valid_rows_is_a_no_op():
    estimator = estimator_with_history([0.25, 0.75])
    rewards, uids = with_padding(torch.zeros(0, dtype=torch.float64), np.array([], dtype=object), 4)
    assert torch.count_nonzero(estimator.compute(rewards, uids)) == 0
    np.testing.assert_array_equal(estimator.history, [0.25, 0.75])
    assert estimator.num_updates == 0
    assert estimator.metrics["ha_dw/anchor"] == 0.5


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (1.5, r"Rewards must lie in algorithm.ha_dw.reward_range=\[0, 1\]; rows \[2\] hold \[1.5\]"),
        (-0.2, r"rows \[2\] hold \[-0.2\]"),
        (float("nan"), r"Rewards must be finite; rows \[2\]"),
        (float("inf"), r"Rewards must be finite; rows \[2\]"),
    ],
)
def test_bad_rewards_raise_and_leave_state_and_metrics_unchanged(reward, message):
    estimator = estimator_with_history([0.3, 0.6])
    estimator.compute(*groups([[1, 0, 0]], "warm"))
    before_state, before_metrics = estimator.state_dict(), dict(estimator.metrics)
    rewards, uids = groups(WORKED)
    rewards[2] = reward
    with pytest.raises(ValueError, match=message):
        estimator.compute(rewards, uids)
    assert torch.equal(estimator.state_dict()["history"], before_state["history"])
    assert estimator.num_updates == before_state["num_updates"] and estimator.metrics == before_metrics


def test_float_noise_at_the_range_edge_is_not_an_error_and_its_state_reloads():
    rewards, uids = groups([[1, 1]])
    rewards[0] = 1.0 + 1e-9
    estimator = HADWEstimator()
    estimator.compute(rewards, uids)
    assert estimator.history[0] == 1.0  # clipped to the range (core.rows.read_rows)
    state = estimator.state_dict()
    HADWEstimator().load_state_dict(state)
    state["history"] = torch.full_like(torch.as_tensor(state["history"]), 1.0 + 1e-9)  # saved before the clip
    HADWEstimator().load_state_dict(state)


@pytest.mark.parametrize(
    ("bad_call", "message"),
    [
        (lambda e: e.compute(torch.zeros(3), np.array(["a"] * 4, dtype=object)), "one entry per row"),
        (lambda e: e.compute(torch.zeros(2, 2), np.array(["a"] * 2, dtype=object)), "1-D float tensor"),
        (lambda e: e.compute(torch.zeros(2), np.array(["a"] * 2, dtype=object), valid=np.ones(2)), "bool mask"),
        (lambda e: e.compute_token_level(torch.zeros(2, 3), torch.ones(2, 4), np.array(["a"] * 2)), "must both be"),
    ],
)
def test_malformed_inputs_raise_clear_errors(bad_call, message):
    estimator = estimator_with_history([0.5])
    with pytest.raises(ValueError, match=message):
        bad_call(estimator)
    assert estimator.num_updates == 0


# ---------------------------------------------------------------------------------------- parity with verl
def verl_grpo(rewards, uids, norm_by_std, seed=0):
    token_rewards, mask = token_level(rewards.float(), seed=seed)
    expected, _ = get_adv_estimator_fn("grpo")(
        token_level_rewards=token_rewards, response_mask=mask, index=uids, norm_adv_by_std_in_grpo=norm_by_std
    )
    return token_rewards, mask, expected


def batch_centred_on(center: float, seed: int):
    """Groups (and paired singletons) whose means all equal ``center``, rows shuffled as verl would hand them."""
    generator = np.random.default_rng(seed)
    group_rewards = []
    for _ in range(generator.integers(2, 8)):
        spread = generator.uniform(0, min(center, 1 - center), size=generator.integers(1, 5))
        group_rewards.append([center + d for d in spread] + [center - d for d in spread])
    spread = generator.uniform(0, min(center, 1 - center))
    group_rewards += [[center + spread], [center - spread]]  # two singletons with mean center between them
    rewards, uids = groups(group_rewards, f"c{seed}")
    order = torch.from_numpy(generator.permutation(len(uids)))
    return rewards[order], uids[order.numpy()]


@pytest.mark.parametrize("norm_adv_by_std", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_with_phi_one_ha_dw_is_verl_grpo(norm_adv_by_std, seed):
    """lambda = 1 and every group at the anchor (diff = 0) make Phi = 1: the output is verl's grpo, singletons too."""
    rewards, uids = batch_centred_on(center=0.5, seed=seed)
    token_rewards, mask, expected = verl_grpo(rewards, uids, norm_adv_by_std, seed)
    estimator = HADWEstimator(HADWConfig(lambda_scale=1.0, norm_adv_by_std=norm_adv_by_std))
    actual, _ = estimator.compute_token_level(token_rewards, mask, uids)  # first call: a = y_t = 0.5
    assert estimator.metrics["ha_dw/anchor"] == pytest.approx(0.5)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["window", "kalman"])
@pytest.mark.parametrize("seed", range(4))
def test_ha_dw_is_phi_times_verl_grpo(mode, seed):
    """On random 0/1 batches, each row's advantage is Phi (recomputed here from its definition) times verl's grpo."""
    generator = np.random.default_rng(seed)
    group_rewards = [generator.integers(0, 2, generator.integers(1, 9)).tolist() for _ in range(10)]
    rewards, uids = groups(group_rewards, f"r{seed}")
    token_rewards, mask, grpo = verl_grpo(rewards, uids, True, seed)
    estimator = estimator_with_history([0.2, 0.7, 0.6], mode=mode)
    anchor = estimator.anchor
    actual, _ = estimator.compute_token_level(token_rewards, mask, uids)
    for group, values in enumerate(group_rewards):
        rows = uids == f"r{seed}-{group}"
        grpo_rows = sequence(grpo, mask)[rows].double()
        diff = float(np.mean(values)) - anchor
        phi = 1.3 * torch.exp(-torch.sign(grpo_rows) * np.sign(diff) * abs(diff)) if len(values) > 1 else 1.0
        torch.testing.assert_close(sequence(actual, mask)[rows].double(), phi * grpo_rows, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------- state
@pytest.mark.parametrize("mode", ["window", "kalman"])
def test_state_round_trip_continues_bit_for_bit(mode):
    batches = [groups([[1, 0, 0, 1], [1, 1, 1, 1], [0, 1]], f"b{step}") for step in range(3)]
    later = [groups([[0, 0, 0, 1], [1, 0, 1]], f"l{step}") for step in range(4)]
    uninterrupted = HADWEstimator(HADWConfig(mode=mode, window=3, belief_window=3))
    for batch in batches:
        uninterrupted.compute(*batch)
    buffer = io.BytesIO()
    torch.save(uninterrupted.state_dict(), buffer)
    buffer.seek(0)
    resumed = HADWEstimator(HADWConfig(mode=mode, window=3, belief_window=3))
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for batch in later:
        assert torch.equal(resumed.compute(*batch), uninterrupted.compute(*batch))
        assert resumed.metrics == uninterrupted.metrics
    assert same_state(resumed, uninterrupted)


def corrupt(state, **changes):
    return {**state, **changes}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: corrupt(s, format_version=99), "Unsupported HA-DW state format 99"),
        (lambda s: corrupt(s, config={**s["config"], "mode": "kalman"}), "is a 'kalman' history"),
        (lambda s: corrupt(s, config={**s["config"], "lambda_scale": 1.5}), r"'lambda_scale': \(1.5, 1.3\)"),
        (lambda s: corrupt(s, config={**s["config"], "lamda": 1.5}), r"Unknown option\(s\) algorithm.ha_dw.\{lamda\}"),
        (lambda s: corrupt(s, history=torch.tensor([0.5, float("nan")])), "NaN"),
        (lambda s: corrupt(s, history=torch.tensor([0.5, 1.5])), "outside its reward range"),
        (lambda s: corrupt(s, history=torch.full((11,), 0.5)), "more than its window capacity 10"),
        (lambda s: corrupt(s, history=[0.5]), "must be a 1-D float tensor"),
        (lambda s: corrupt(s, num_updates=-1), "non-negative int"),
        (lambda s: {k: v for k, v in s.items() if k != "config"}, "has no 'config'"),
    ],
)
def test_bad_state_is_refused_and_nothing_changes(change, message):
    source = estimator_with_history([0.25, 0.5])
    target = estimator_with_history([0.75])
    with pytest.raises(ValueError, match=message):
        target.load_state_dict(change(source.state_dict()))
    np.testing.assert_array_equal(target.history, [0.75])


def test_allow_config_change_keeps_current_options_and_the_newest_history():
    saved = estimator_with_history([0.1, 0.2, 0.3], window=3)
    current = HADWEstimator(HADWConfig(window=2, lambda_scale=1.5))
    current.load_state_dict(saved.state_dict(), allow_config_change=True)
    np.testing.assert_array_equal(current.history, [0.2, 0.3])
    assert current.config.lambda_scale == 1.5


# ------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lambda_scale": 0}, "lambda_scale=0 is invalid"),
        ({"lambda_scale": float("nan")}, "must be a finite number"),
        ({"mode": "ema"}, "must be one of window, kalman"),
        ({"window": 0}, "window=0 is invalid: it must be an int >= 1"),
        ({"window": 2.0}, "must be an int"),
        ({"eta_min": 1.5}, "must be in \\[0, 1\\]"),
        ({"anchor": "current"}, "must be one of prior, with_current"),
        ({"reward_range": [1, 0]}, "finite lo < hi"),
        ({"reward_range": [0]}, "finite lo < hi"),
        ({"norm_adv_by_std": "yes"}, "must be true or false"),
    ],
)
def test_config_validation_names_the_option(options, message):
    with pytest.raises(ValueError, match=message):
        HADWConfig(**options)


def test_config_from_mapping_rejects_misspelt_keys_and_accepts_lists():
    config = HADWConfig.from_mapping({"reward_range": [0, 10], "mode": "kalman"})
    assert config.reward_range == (0.0, 10.0) and config.to_dict()["reward_range"] == [0.0, 10.0]
    with pytest.raises(ValueError, match=r"algorithm.ha_dw.\{lamda_scale\}"):
        HADWConfig.from_mapping({"lamda_scale": 1.3})
    assert HADWConfig() == HADWConfig.from_mapping(HADWConfig().to_dict())


# ------------------------------------------------------------------------------------------------ properties
batches = st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=6), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(group_rewards=batches, seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(["window", "kalman"]))
def test_permuting_rows_permutes_advantages_and_keeps_the_state(group_rewards, seed, mode):
    rewards, uids = groups(group_rewards)
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(uids)))
    straight, shuffled = (estimator_with_history([0.3, 0.6], mode=mode) for _ in range(2))
    expected = straight.compute(rewards, uids)
    actual = shuffled.compute(rewards[order], uids[order.numpy()])
    torch.testing.assert_close(actual, expected[order], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(shuffled.history, straight.history, rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(group_rewards=batches, pads=st.integers(1, 4), junk=st.sampled_from([float("nan"), 5.0, -3.0]))
def test_padding_rows_are_inert(group_rewards, pads, junk):
    rewards, uids = groups(group_rewards)
    clean, padded = estimator_with_history([0.5]), estimator_with_history([0.5])
    expected = clean.compute(rewards, uids)
    actual = padded.compute(*with_padding(rewards, uids, pads, junk))
    assert torch.equal(actual[: len(uids)], expected) and torch.count_nonzero(actual[len(uids) :]) == 0
    assert same_state(clean, padded) and clean.metrics == padded.metrics
