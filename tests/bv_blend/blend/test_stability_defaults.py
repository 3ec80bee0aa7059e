"""The stability defaults of spec section 5 step 8 (variance_floor="prior", max_abs_advantage="auto"), pinned against
hand-computed values, against verl's own grpo, against the hazard they fix, and against states saved before them.

Every expected number below is worked out with scalar arithmetic from the spec's formulas.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from bv_blend import BVBlendConfig, BVBlendEstimator
from bv_blend.blend.estimator import AUTO_CLIP_MIN
from tests._estimator_helpers import batch_of_groups, state_tensors
from tests.bv_blend.blend.test_collapse_theorem import token_level

EPS = 1e-6
LITERAL = {"variance_floor": "none", "max_abs_advantage": None}  # the paper's formulas exactly


def run(estimator, group_rewards, group_clusters, prefix):
    return estimator.compute(*batch_of_groups(group_rewards, group_clusters, prefix))


def auto_bound(rows: int) -> float:
    return max(5.0, (rows - 1) / math.sqrt(rows))


def test_the_defaults_are_the_safe_ones_and_none_none_is_the_paper():
    config = BVBlendConfig()
    assert (config.variance_floor, config.max_abs_advantage) == ("prior", "auto")
    assert BVBlendConfig(**LITERAL).variance_floor == "none" and BVBlendConfig(**LITERAL).max_abs_advantage is None


@pytest.mark.parametrize(("rows", "bound"), [(1, 5.0), (2, 5.0), (8, 5.0), (26, 5.0), (27, 26 / math.sqrt(27)),
                                             (36, 35 / 6), (64, 63 / 8)])  # fmt: skip
def test_auto_bound_by_group_size(rows, bound):
    """The estimator's own bound (spec 5 step 8) for a group of ``rows`` rows, against the hand-computed value; the
    tests below use this file's ``auto_bound`` as the expected value."""
    groups, one_row = SimpleNamespace(count=np.array([float(rows)])), SimpleNamespace(codes=np.array([0]))
    product = BVBlendEstimator(num_clusters=1)._advantage_bound(one_row, groups)
    assert product[0] == pytest.approx(bound) == auto_bound(rows) and AUTO_CLIP_MIN == 5.0


# ------------------------------------------------------------------------------------------- variance floor
@pytest.fixture
def cluster_that_never_varies():
    """K=2, gamma=0.5, n0=2, v_prior=0.25, T=1; cluster 1 sees [0, 0] twice.

    Call 1: cold start N = 2, m1 = 0, m2 = 0 + 0.25;  EMA N = 0.5*2 + 2 = 3, m2 = (1*0.25 + 0)/3 = 1/12.
    Call 2: EMA N = 0.5*3 + 2 = 3.5, m2 = (1.5 * 1/12 + 0)/3.5 = 1/28.
    So v = m2 - m1^2 = 1/28, below the floor V_prior / max(N, delta_N) = 0.25/3.5 = 1/14: v_k = 1/14.
    """

    def make(**options):
        config = BVBlendConfig(gamma=0.5, n0=2.0, v_prior=0.25, temperature=1.0, **options)
        estimator = BVBlendEstimator(num_clusters=2, config=config)
        run(estimator, [[0, 0]], [1], "call1")
        run(estimator, [[0, 0]], [1], "call2")
        state = state_tensors(estimator)
        torch.testing.assert_close(state["count"], torch.tensor([0.0, 3.5], dtype=torch.float64))
        torch.testing.assert_close(state["second_moment"][1], torch.tensor(1 / 28, dtype=torch.float64))
        return estimator

    return make


@pytest.mark.parametrize(
    ("weight_mode", "weight"),
    [
        ("sem", math.exp(-1 / 7)),  # SEM = sqrt(v / N) = sqrt((1/14) / 3.5) = 1/7
        ("sigma", math.exp(-math.sqrt(1 / 14))),  # sigma_k of the floored v_k
        ("neff", math.exp(-math.sqrt(0.25 / 3.5))),  # no v_k in the weight
        ("fixed", 0.5),
    ],
)
def test_the_floor_raises_v_in_the_weight_and_in_the_scale_of_every_mode(
    cluster_that_never_varies, weight_mode, weight
):
    """Call 3, cluster 1, group [1, 0, 0, 0]: mean 0.25, std^2 = (1 - 4 * 0.25^2) / 3 = 0.25, v_k = 1/14.

    b = w*0 + (1 - w)*0.25, s = sqrt(w/14 + (1 - w)*0.25); the auto bound 5 is not reached.
    """
    estimator = cluster_that_never_varies(weight_mode=weight_mode)
    advantages = run(estimator, [[1, 0, 0, 0]], [1], "call3")
    baseline, scale = (1 - weight) * 0.25, math.sqrt(weight / 14 + (1 - weight) * 0.25)
    expected = [(r - baseline) / (scale + EPS) for r in (1, 0, 0, 0)]
    torch.testing.assert_close(advantages, torch.tensor(expected))
    assert max(abs(a) for a in expected) < 5.0
    assert estimator.metrics["bv_blend/weight_mean"] == pytest.approx(weight)
    assert estimator.metrics["bv_blend/hist_var_mean"] == pytest.approx(1 / 14)
    assert estimator.metrics["bv_blend/variance_floor_active_ratio"] == 1.0


def test_without_the_floor_the_same_call_is_the_papers(cluster_that_never_varies):
    """variance_floor=none: v = 1/28, SEM = sqrt((1/28) / 3.5) = sqrt(1/98)."""
    estimator = cluster_that_never_varies(variance_floor="none")
    advantages = run(estimator, [[1, 0, 0, 0]], [1], "call3")
    weight = math.exp(-math.sqrt(1 / 98))
    baseline, scale = (1 - weight) * 0.25, math.sqrt(weight / 28 + (1 - weight) * 0.25)
    torch.testing.assert_close(advantages, torch.tensor([(r - baseline) / (scale + EPS) for r in (1, 0, 0, 0)]))
    assert estimator.metrics["bv_blend/hist_var_mean"] == pytest.approx(1 / 28)
    assert estimator.metrics["bv_blend/variance_floor_active_ratio"] == 0.0


def test_the_floor_is_inactive_where_the_history_varies_enough():
    """Cluster 0 sees [1, 0, 1, 1] (gamma=0.5, n0=2): N = 5, m1 = 0.75, m2 = 0.7625, v = 0.2375 > 0.25/5."""
    config = BVBlendConfig(gamma=0.5, n0=2.0, temperature=1.0)
    literal_config = BVBlendConfig(**{**config.to_dict(), **LITERAL})
    floored, literal = BVBlendEstimator(1, config), BVBlendEstimator(1, literal_config)
    for estimator in (floored, literal):
        run(estimator, [[1, 0, 1, 1]], [0], "history")
    torch.testing.assert_close(run(floored, [[1, 1, 0]], [0], "now"), run(literal, [[1, 1, 0]], [0], "now"),
                               rtol=0, atol=0)  # fmt: skip
    assert floored.metrics["bv_blend/variance_floor_active_ratio"] == 0.0
    assert floored.metrics["bv_blend/hist_var_mean"] == pytest.approx(0.7625 - 0.75**2)


# ---------------------------------------------------------------------------------------------- auto clip
@pytest.mark.parametrize("rows", [4, 36, 64])
def test_auto_clips_each_group_at_its_own_bound(rows):
    """No floor, 20 all-wrong calls: the first success of a group of n rows clips at max(5, (n-1)/sqrt(n))."""
    clipped = BVBlendEstimator(1, BVBlendConfig(variance_floor="none"))
    unclipped = BVBlendEstimator(1, BVBlendConfig(**LITERAL))
    for call in range(20):
        for estimator in (clipped, unclipped):
            run(estimator, [[0] * rows], [0], f"wrong{call}")
    success = [1] + [0] * (rows - 1)
    free = run(unclipped, [success], [0], "success")
    advantages = run(clipped, [success], [0], "success")
    bound = auto_bound(rows)
    assert free[0] > bound  # the clip binds here
    assert advantages[0].item() == pytest.approx(bound, rel=1e-6) and advantages.abs().max() <= bound * (1 + 1e-6)
    unchanged = free.abs() <= bound
    torch.testing.assert_close(advantages[unchanged], free[unchanged], rtol=0, atol=0)
    assert clipped.metrics["bv_blend/abs_advantage_max"] == pytest.approx(bound, rel=1e-6)


def test_a_number_clips_every_row_at_it():
    estimator = BVBlendEstimator(1, BVBlendConfig(max_abs_advantage=0.5))
    assert run(estimator, [[1, 0, 0, 0]], [0], "a").abs().max() == 0.5


# ------------------------------------------------------------------------------------- w = 0 is verl's grpo
def extremal_groups(rows: int) -> list[list[float]]:
    """Groups of ``rows`` rows where GRPO's |A| is largest ((n-1)/sqrt(n), one row against the rest), plus
    balanced, constant and real-valued ones."""
    rng = np.random.default_rng(rows)
    return [
        [1.0] + [0.0] * (rows - 1),
        [0.0] + [1.0] * (rows - 1),
        [float(i % 2) for i in range(rows)],
        [1.0] * rows,
        rng.normal(size=rows).tolist(),
        (rng.standard_cauchy(size=rows) * 10).tolist(),
    ]


def test_with_the_defaults_on_w0_is_verls_grpo_for_groups_of_2_to_64_rows():
    """Auto never binds without history: by Samuelson's inequality, |R_i - mean| <= (n-1)/sqrt(n) * std_unbiased
    for any n values, so GRPO's |A| = |R_i - mean| / (std + eps) < (n-1)/sqrt(n) <= max(5, (n-1)/sqrt(n)). The floor
    only enters through w v_k, which is 0. So the defaults give verl's grpo exactly where the paper's formulas do."""
    groups = [group for rows in range(2, 65) for group in extremal_groups(rows)]
    rewards, uids, clusters = batch_of_groups(groups, list(range(len(groups))), "g")
    order = np.random.default_rng(0).permutation(len(rewards))  # verl does not keep groups contiguous
    rewards, uids, clusters = rewards[order], uids[order], clusters[order]
    token_rewards, mask = token_level(rewards)
    expected, _ = get_adv_estimator_fn("grpo")(token_level_rewards=token_rewards, response_mask=mask, index=uids,
                                               epsilon=EPS)  # fmt: skip
    defaults, _ = BVBlendEstimator(len(groups)).compute_token_level(token_rewards, mask, uids, clusters)
    literal, _ = BVBlendEstimator(len(groups), BVBlendConfig(**LITERAL)).compute_token_level(
        token_rewards, mask, uids, clusters
    )
    torch.testing.assert_close(defaults, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(defaults, literal)  # bit for bit: neither option changed anything
    # The bound is tight: the one-against-the-rest groups reach (n-1)/sqrt(n) up to eps.
    sequence = expected.sum(-1) / mask.sum(-1)
    group_sizes = [len(group) for group in groups]
    row_sizes = torch.from_numpy(np.repeat(group_sizes, group_sizes)[order])
    for rows in (2, 8, 27, 64):
        largest = sequence[row_sizes == rows].abs().max().item()
        assert (rows - 1) / math.sqrt(rows) * (1 - 1e-4) < largest < auto_bound(rows)


# ------------------------------------------------------------------------------------------ the hazard, fixed
def replay_all_wrong_then_one_success(config: BVBlendConfig, rows: int, calls: int = 1000) -> torch.Tensor:
    estimator = BVBlendEstimator(1, config)
    clusters = torch.zeros(rows, dtype=torch.long)
    for call in range(calls):
        estimator.compute(torch.zeros(rows), np.array([f"call{call}"] * rows, dtype=object), clusters)
    success = torch.zeros(rows)
    success[0] = 1.0
    return estimator.compute(success, np.array(["success"] * rows, dtype=object), clusters)


@pytest.mark.parametrize("rows", [8, 64])
def test_one_success_after_1000_all_wrong_calls_stays_within_the_specs_bound(rows):
    """Spec section 8: with the defaults, rewards in [0, 1] and groups of at most 64 rows, |A| <= max(5, 7.9)."""
    advantages = replay_all_wrong_then_one_success(BVBlendConfig(), rows)
    assert advantages.abs().max() <= auto_bound(rows) * (1 + 1e-6) <= 7.9
    # The same replay with the paper's formulas is the hazard the defaults fix.
    assert replay_all_wrong_then_one_success(BVBlendConfig(**LITERAL), rows)[0] > 1000


def test_the_floor_alone_keeps_the_success_near_ten():
    """variance_floor=prior, no clip, groups of 8, gamma 0.9: after 1000 all-wrong calls N = 8/(1-0.9) = 80 (to
    float precision), m1 = 0 and v_k = the floor 0.25/80. SEM = sqrt(0.25/80/80) = 1/160, w = exp(-0.0625).
    The success: b = (1-w)/8, s^2 = w * 0.25/80 + (1-w) * 1/8, A = (1 - b)/(s + eps)."""
    advantage = replay_all_wrong_then_one_success(BVBlendConfig(max_abs_advantage=None), 8)[0].item()
    weight = math.exp(-0.0625)
    expected = (1 - (1 - weight) / 8) / (math.sqrt(weight * 0.25 / 80 + (1 - weight) / 8) + EPS)
    assert advantage == pytest.approx(expected, rel=1e-5) and 9 < advantage < 10


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(1, 64), st.integers(0, 2), st.floats(0, 1)), min_size=1, max_size=4),
                min_size=1, max_size=12), st.randoms(use_true_random=False))  # fmt: skip
def test_no_sequence_of_calls_with_rewards_in_0_1_exceeds_the_bound(calls, random):
    """Spec section 8's invariant, over random call sequences: groups of 1..64 rows, binary or real rewards in
    [0, 1], three clusters, with the defaults."""
    estimator = BVBlendEstimator(3)
    for index, groups in enumerate(calls):
        group_rewards = [[float(random.random() < p) if p < 0.5 else random.random() for _ in range(rows)]
                         for rows, _, p in groups]  # fmt: skip
        advantages = run(estimator, group_rewards, [cluster for _, cluster, _ in groups], f"call{index}")
        assert advantages.abs().max() <= max(5.0, 63 / 8) * (1 + 1e-6)


# ------------------------------------------------------------------------------------ states of other formats
@pytest.mark.parametrize("version", [1, 2, None])
def test_a_state_of_another_format_is_refused_and_changes_nothing(version):
    """Format 1 (written before the stability options) and any unknown version are refused with the version read and
    the one this version reads; the package has no released format that needs a migration."""
    saved = BVBlendEstimator(3)
    run(saved, [[0, 0, 0, 0], [1, 0, 1, 1]], [0, 1], "c0g")
    state = {**saved.state_dict(), "format_version": version}
    estimator = BVBlendEstimator(3)
    before = state_tensors(estimator)
    with pytest.raises(ValueError, match=f"Unsupported BV-Blend state format {version!r}; this version reads format 3"):
        estimator.load_state_dict(state)
    for name, tensor in state_tensors(estimator).items():
        assert torch.equal(tensor, before[name]), name
