"""BV-Blend's history levels (history_spec 3, 4 and 6): prompt moments per visit, the blend over the cluster's, and
the priors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bv_blend import BVBlendConfig, BVBlendEstimator

PROMPT = BVBlendConfig(history_level="prompt")
BOTH = BVBlendConfig(history_level="prompt_and_cluster")


def call(estimator, groups, keys, clusters=None, prefix="u", valid=None):
    """Whole groups: ``groups`` lists of rewards, one prompt key (and cluster) per group."""
    rewards = torch.tensor([r for g in groups for r in g], dtype=torch.float64)
    uids = np.array([f"{prefix}{i}" for i, g in enumerate(groups) for _ in g], dtype=object)
    row_keys = np.array([k for k, g in zip(keys, groups, strict=True) for _ in g], dtype=object)
    row_clusters = None
    if clusters is not None:
        row_clusters = torch.tensor([c for c, g in zip(clusters, groups, strict=True) for _ in g])
    return estimator.compute(rewards, uids, row_clusters, valid=valid, prompt_keys=row_keys).numpy()


def moments(estimator, key):
    count, mean, second, seen = estimator.prompts.lookup([key])
    return float(count[0]), float(mean[0]), float(second[0]), bool(seen[0])


def test_the_prompt_level_by_hand():
    """First visit: no history, so verl's GRPO; cold start N = n0 = 1, m1 = 0.5, m2 = 0.25 + 0.25, then one EMA step
    with rho_p = 0.875 and n = 4: N = 4.875, m1 = (0.875 * 0.5 + 2) / 4.875, m2 likewise (S2 = 2). The second visit
    blends those in."""
    estimator = BVBlendEstimator(None, PROMPT)
    first = call(estimator, [[1, 0, 1, 0]], ["p"])
    np.testing.assert_allclose(first, [0.5, -0.5, 0.5, -0.5] / (np.sqrt(1 / 3) + 1e-6))
    count, mean, second, seen = moments(estimator, "p")
    assert seen and count == pytest.approx(4.875)
    assert mean == pytest.approx((0.875 * 0.5 + 2) / 4.875) and second == pytest.approx((0.875 * 0.5 + 2) / 4.875)

    advantage = call(estimator, [[1, 1, 1, 1]], ["p"], prefix="v")  # all right: GRPO would give 0
    variance = max(second - mean**2, 0.25 / count)  # the prior floor
    weight = math.exp(-math.sqrt(variance / count) / 0.1)
    baseline, scale = weight * mean + (1 - weight) * 1.0, math.sqrt(weight * variance)
    np.testing.assert_allclose(advantage, (1 - baseline) / (scale + 1e-6), rtol=1e-12)
    assert advantage[0] > 0
    assert estimator.metrics["bv_blend/prompt_seen_ratio"] == 1.0
    assert estimator.metrics["bv_blend/prompt_weight_mean"] == pytest.approx(weight)
    assert estimator.metrics["bv_blend/prompts_tracked"] == 1.0


def test_a_prompt_revisited_after_many_calls_keeps_its_history():
    estimator = BVBlendEstimator(None, PROMPT)
    call(estimator, [[1, 0]], ["p"])
    kept = moments(estimator, "p")
    for step in range(200):  # other prompts only: no per-call decay at the prompt level
        call(estimator, [[0, 1]], [f"other{step}"], prefix=f"s{step}")
    assert moments(estimator, "p") == kept


def test_prompt_and_cluster_without_prompt_history_is_bv_blend_and_without_any_history_is_grpo():
    """Every call brings new prompts: the prompt level never has history, so the advantages are BV-Blend's."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rng = np.random.default_rng(0)
    both, cluster = BVBlendEstimator(3, BOTH), BVBlendEstimator(3)
    for step in range(6):
        groups = [list(rng.integers(0, 2, 4).astype(float)) for _ in range(5)]
        clusters = list(rng.integers(0, 3, 5))
        keys = [f"s{step}p{g}" for g in range(5)]
        a = call(both, groups, keys, clusters, prefix=f"s{step}")
        b = cluster.compute(torch.tensor([r for g in groups for r in g], dtype=torch.float64),
                            np.array([f"s{step}{i}" for i, g in enumerate(groups) for _ in g], dtype=object),
                            torch.tensor([c for c, g in zip(clusters, groups, strict=True) for _ in g])).numpy()
        np.testing.assert_array_equal(a, b)
        if step == 0:  # no history at all: verl's own grpo
            token = torch.tensor([r for g in groups for r in g]).unsqueeze(-1)
            uids = np.array([f"u{i}" for i, g in enumerate(groups) for _ in g], dtype=object)
            grpo, _ = compute_grpo_outcome_advantage(token, torch.ones_like(token), uids)
            np.testing.assert_allclose(a, grpo[:, 0].numpy(), rtol=1e-5, atol=1e-6)


def test_prompt_and_cluster_blends_the_prompt_over_the_cluster():
    """b = w_p m1_p + (1 - w_p) b_k, s^2 = w_p v_p + (1 - w_p) s_k^2 (history_spec 3), by hand from the state."""
    estimator = BVBlendEstimator(2, BOTH)
    call(estimator, [[1, 0, 0, 0], [1, 1, 1, 0]], ["p", "q"], [0, 1], prefix="a")

    def weight_and_variance(count, mean, second):
        variance = max(second - mean**2, 0.25 / max(count, 1.0))
        return math.exp(-math.sqrt(variance / max(count, 1.0)) / 0.1), variance

    k = estimator.moments
    w_k, v_k = weight_and_variance(k.count[0], k.mean[0], k.second_moment[0])
    count, mean, second, _ = moments(estimator, "p")
    w_p, v_p = weight_and_variance(count, mean, second)
    group = np.array([0.0, 1.0, 0.0, 0.0])
    b_k = w_k * k.mean[0] + (1 - w_k) * group.mean()
    s2_k = w_k * v_k + (1 - w_k) * group.var(ddof=1)
    baseline, scale = w_p * mean + (1 - w_p) * b_k, math.sqrt(w_p * v_p + (1 - w_p) * s2_k)
    expected = np.clip((group - baseline) / (scale + 1e-6), -5, 5)
    np.testing.assert_allclose(call(estimator, [list(group)], ["p"], [0], prefix="b"), expected, rtol=1e-12)


def test_the_prompt_level_needs_no_codebook_and_its_inputs_are_required():
    estimator = BVBlendEstimator(None, PROMPT)
    assert estimator.num_clusters == 1
    rewards, uids = torch.tensor([1.0, 0.0]), np.array(["u", "u"], dtype=object)
    with pytest.raises(ValueError, match="history_level=prompt needs prompt_keys"):
        estimator.compute(rewards, uids)
    with pytest.raises(ValueError, match="history_level=prompt_and_cluster needs cluster_ids"):
        BVBlendEstimator(2, BOTH).compute(rewards, uids, prompt_keys=np.array(["p", "p"], dtype=object))
    with pytest.raises(ValueError, match="needs num_clusters"):
        BVBlendEstimator(None, BOTH)
    with pytest.raises(ValueError, match="have no prompt key"):
        estimator.compute(rewards, uids, prompt_keys=np.array(["p", None], dtype=object))
    assert estimator.num_updates == 0 and len(estimator.prompts) == 0


groups_strategy = st.lists(
    st.tuples(st.sampled_from("abcd"), st.integers(0, 1), st.lists(st.sampled_from([0.0, 1.0]), min_size=1,
                                                                       max_size=4)),
    min_size=1, max_size=6, unique_by=lambda g: g[0],
)  # fmt: skip


@settings(max_examples=50, deadline=None)
@given(groups_strategy, st.randoms(use_true_random=False), st.sampled_from(["prompt", "prompt_and_cluster"]))
def test_rows_are_exchangeable_and_padding_changes_nothing(groups, random, level):
    config = BVBlendConfig(history_level=level)
    rewards = [r for _, _, g in groups for r in g]
    keys = [k for k, _, g in groups for _ in g]
    clusters = [c for _, c, g in groups for _ in g]
    uids = [f"u{k}" for k in keys]
    order = list(range(len(rewards)))
    random.shuffle(order)
    estimators = [BVBlendEstimator(2, config) for _ in range(3)]
    for estimator in estimators:  # a history first
        call(estimator, [[1, 0], [0, 0]], ["a", "b"], [0, 1], prefix="h")

    def run(estimator, rows, extra_valid=None):
        return estimator.compute(torch.tensor([rewards[i] if i >= 0 else 7.0 for i in rows], dtype=torch.float64),
                                 np.array([uids[i] if i >= 0 else "pad1" for i in rows], dtype=object),
                                 torch.tensor([clusters[i] if i >= 0 else 0 for i in rows]),
                                 prompt_keys=np.array([keys[i] if i >= 0 else None for i in rows], dtype=object),
                                 valid=extra_valid).numpy()  # fmt: skip

    a = run(estimators[0], list(range(len(rewards))))
    np.testing.assert_allclose(run(estimators[1], order), a[order], rtol=0, atol=1e-12)
    padded = run(estimators[2], [*range(len(rewards)), -1])
    np.testing.assert_array_equal(padded[:-1], a)
    assert padded[-1] == 0
    states = [e.state_dict()["prompts"] for e in estimators]
    for state in states[1:]:
        assert dict(zip(state["keys"], state["mean"].tolist(), strict=True)) == pytest.approx(
            dict(zip(states[0]["keys"], states[0]["mean"].tolist(), strict=True)))


@pytest.mark.parametrize("level", ["cluster", "prompt", "prompt_and_cluster"])
def test_save_and_restore_mid_run_gives_the_same_advantages_bit_for_bit(level):
    config = BVBlendConfig(history_level=level)
    rng = np.random.default_rng(1)
    calls = [([list(rng.integers(0, 2, 2).astype(float)) for _ in range(4)], [f"p{k}" for k in
              rng.choice(6, 4, replace=False)], list(rng.integers(0, 3, 4))) for _ in range(8)]  # fmt: skip
    uninterrupted, first = BVBlendEstimator(3, config), BVBlendEstimator(3, config)
    expected = [call(uninterrupted, g, k, c, prefix=f"s{i}") for i, (g, k, c) in enumerate(calls)]
    for i, (g, k, c) in enumerate(calls[:4]):
        call(first, g, k, c, prefix=f"s{i}")
    resumed = BVBlendEstimator(3, config)
    resumed.load_state_dict(torch.load(_saved(first.state_dict()), weights_only=True))
    for i, (g, k, c) in enumerate(calls[4:], start=4):
        np.testing.assert_array_equal(call(resumed, g, k, c, prefix=f"s{i}"), expected[i])


def _saved(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_a_state_of_another_level_is_refused_with_the_option_that_continues_it():
    saved = BVBlendEstimator(3, BOTH)
    call(saved, [[1, 0]], ["p"], [0])
    with pytest.raises(ValueError, match="history_level='prompt_and_cluster'"):
        BVBlendEstimator(3).load_state_dict(saved.state_dict())


def test_warm_start_from_prior_scores():
    """history_spec 4: a prompt with N scores starts at N_p = min(N, n0_prior) with their mean and mean square; a
    cluster from its prompts' pooled scores with N_k = n0_prior; w > 0 from the first call."""
    estimator = BVBlendEstimator(2, BOTH)
    estimator.warm_start({"p": [1, 1, 0, 1, 1, 1, 1, 1], "q": [0, 1]}, {"p": 0, "q": 0, "absent": 1})
    assert moments(estimator, "p") == pytest.approx((4.0, 0.875, 0.875, True))
    assert moments(estimator, "q") == pytest.approx((2.0, 0.5, 0.5, True))
    assert estimator.moments.seen.tolist() == [True, False]
    assert estimator.moments.count[0] == 4.0 and estimator.moments.mean[0] == pytest.approx(8 / 10)
    call(estimator, [[0, 0, 0, 0]], ["p"], [0])  # all wrong on an easy prompt: negative at once
    assert estimator.metrics["bv_blend/prompt_weight_mean"] > 0 and estimator.metrics["bv_blend/weight_mean"] > 0
    with pytest.raises(ValueError, match="before training"):
        estimator.warm_start({"p": [1]})
