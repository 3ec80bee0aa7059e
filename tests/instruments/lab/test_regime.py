"""The no-revisit regime of the logistic lab (instruments/lab/regime.py): its pool, held-out split, codebook, Knapsack
arm, priors path and summary, on a small task (a few seconds)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bv_blend.verl import runtime
from instruments import regime
from instruments.allocation import knapsack_allocation
from instruments.lab import regime as lab_regime
from instruments.lab import regime_suite
from instruments.lab.env import EnvConfig, Policy, Rollouts, sigmoid
from instruments.lab.regime import (
    LAB_ARMS,
    NMI_TARGET,
    NOISY_SHARE,
    RegimeSpec,
    RegimeTask,
    calibrate_share,
    codebook_nmi,
    row_gradient,
    run_regime,
)

SMALL_ENV = EnvConfig(num_clusters=4, feature_dim=16)
# 4 clusters x 24 = 96 pool prompts = 6 steps x 16 prompts at n = 1: every pool prompt is drawn once at n = 1
SMALL = RegimeSpec("grpo8", steps=6, budget=16, pool_per_cluster=24, held_out_per_cluster=4, env=SMALL_ENV)


def small(arm: str, seed: int = 0) -> RegimeSpec:
    return replace(SMALL, arm=arm, seed=seed)


def test_the_lab_runs_exactly_the_regime_arms() -> None:
    lab_regime.check_arms()
    assert {key: arm.n for key, arm in LAB_ARMS.items()} == {key: arm.n for key, arm in regime.IN_LABS.items()}
    with pytest.raises(ValueError, match="would come back"):
        replace(SMALL, steps=7)  # 7 x 16 prompts at n = 1 need more than the 96 of the pool


def test_the_pool_never_repeats_a_prompt_and_every_arm_walks_the_same_order() -> None:
    drawn = {arm: run_regime(small(arm, seed=3)).drawn for arm in ("rpp1", "grpo2", "grpo8")}
    pool = RegimeTask(small("rpp1", seed=3)).pool
    for arm, prompts in drawn.items():
        visits = np.bincount(prompts)
        assert visits.max() == 1, arm  # measured from the run's own draws
        assert prompts.size == SMALL.steps * SMALL.budget // LAB_ARMS[arm].n
    assert sorted(drawn["rpp1"]) == sorted(pool)  # n = 1 uses the whole pool, once
    # one permutation a seed: an arm with fewer prompts a step walks a prefix of the same order
    np.testing.assert_array_equal(drawn["grpo8"], drawn["rpp1"][: drawn["grpo8"].size])
    np.testing.assert_array_equal(drawn["grpo2"], drawn["rpp1"][: drawn["grpo2"].size])


def test_held_out_prompts_are_never_drawn_and_are_what_is_judged() -> None:
    world = RegimeTask(small("rpp1"))
    assert world.held_out.size == SMALL_ENV.num_clusters * SMALL.held_out_per_cluster
    assert set(np.unique(world.task.cluster[world.held_out])) == set(range(SMALL_ENV.num_clusters))
    result = run_regime(small("rpp1"))
    assert not set(result.drawn) & set(world.held_out)
    start = sigmoid(-world.task.difficulty(0)[world.held_out]).mean()  # theta = 0 at the start
    assert result.held_out[0] == pytest.approx(start, rel=1e-12)
    assert result.held_out[-1] != result.held_out[0]  # it learned, and the curve follows the policy


def test_the_noisy_codebook_s_nmi_is_near_its_target() -> None:
    nmi = [codebook_nmi(seed) for seed in range(10)]
    assert abs(np.mean(nmi) - NMI_TARGET) < 0.003 and min(nmi) > 0.33 and max(nmi) < 0.37
    assert abs(calibrate_share(range(10), tolerance=1e-3) - NOISY_SHARE) < 2e-3  # the frozen share is the calibration's
    assert codebook_nmi(0, share=0.0) == 1.0 and codebook_nmi(0, share=1.0) < 0.01


def test_the_knapsack_arm_s_groups_have_the_allocated_sizes_and_spend_the_budget() -> None:
    spec = small("knapsack_grpo2", seed=2)
    result, world = run_regime(spec), RegimeTask(spec)
    assert result.rows.tolist() == [spec.budget] * spec.steps
    assert result.advantages.size == result.rewards.size == spec.budget * spec.steps
    trained = result.sizes[result.sizes > 0]
    assert trained.min() >= lab_regime.KNAPSACK_LOW and trained.max() <= lab_regime.KNAPSACK_HIGH
    # step 0: the policy is theta = 0, so the allocation is the Knapsack split of the initial true p
    prompts = world.order[: spec.prompts_per_step]
    expected = knapsack_allocation(sigmoid(-world.task.difficulty(0)[prompts]), spec.budget)
    np.testing.assert_array_equal(result.sizes[0], expected)
    assert (expected == 0).any(), "pick a seed whose first step skips a prompt, to check skipped ones are untrained"
    np.testing.assert_array_equal(result.drawn[: (expected > 0).sum()], prompts[expected > 0])
    # verl's GRPO grouped the rows by uid in groups of those sizes: each group's advantages are centred on its mean
    start = 0
    for size in expected[expected > 0]:
        group = result.advantages[start : start + size]
        assert abs(group.sum()) < 1e-5, (size, group)
        start += size


def test_spo1_equals_rpp1_to_rounding_but_not_bit_for_bit() -> None:
    """No prompt comes back, so SPO's tracker is its prior at every visit: its advantage is the batch-whitened reward,
    REINFORCE++'s, up to where each puts its epsilon (std + 1e-8 in float64, rsqrt(var + 1e-8) in float32)."""
    spo, rpp = run_regime(small("spo1", seed=1)), run_regime(small("rpp1", seed=1))
    np.testing.assert_array_equal(spo.rewards, rpp.rewards)
    assert np.abs(spo.advantages - rpp.advantages).max() < 1e-6
    assert np.abs(spo.held_out - rpp.held_out).max() < 1e-9


def test_the_priors_arms_start_from_the_prior_file(tmp_path: Path) -> None:
    world = RegimeTask(small("bv2_priors"))
    scores = world.prior_scores(0)
    key = world.keys[world.pool[0]]
    lab_regime._estimator(LAB_ARMS["bv2_priors"], world, 0, tmp_path)
    estimator = runtime.held("bv_blend").estimator.estimator
    count, mean, _, seen = estimator.prompts.lookup([key])
    assert seen[0] and count[0] == 4.0 and mean[0] == pytest.approx(np.mean(scores[key]))
    assert estimator.moments.seen.all()  # every cluster pooled its prompts' scores
    lab_regime._estimator(LAB_ARMS["spo1_priors"], world, 0, tmp_path)
    assert len(runtime.held("spo").estimator.offline_values) == world.pool.size


@pytest.mark.parametrize("key", sorted(lab_regime.PRIORS_TWINS))
def test_every_priors_arm_s_advantages_differ_from_its_twin_s(key: str, tmp_path: Path) -> None:
    """Issue 37: on the same batch (the first step's prompts), the priors arm against its twin in the suite and
    against itself without the file."""
    world = RegimeTask(small(key))
    arm = LAB_ARMS[key]
    prompts = world.order[: SMALL.budget // arm.n]
    rows = np.repeat(prompts, arm.n)
    rewards = (np.arange(rows.size) % 3 == 0).astype(np.float64)  # a mixed batch, the same for every arm
    batch = (np.repeat(world.uids(prompts), arm.n), world.cluster_ids[rows], world.keys[rows], np.full(rows.size, .5))

    def advantages(lab_arm: lab_regime.LabArm) -> np.ndarray:
        estimator = lab_regime._estimator(lab_arm, world, 0, tmp_path)
        return lab_regime._advantages(estimator, rewards, *batch)

    with_priors = advantages(arm)
    assert LAB_ARMS[lab_regime.PRIORS_TWINS[key]].estimator.adv_estimator == arm.estimator.adv_estimator
    assert not np.allclose(with_priors, advantages(LAB_ARMS[lab_regime.PRIORS_TWINS[key]]))
    assert not np.allclose(with_priors, advantages(replace(arm, priors=False)))


def test_the_row_gradient_is_the_lab_s_gradient_on_equal_groups() -> None:
    world = RegimeTask(small("grpo8"))
    policy = Policy(world.task)
    policy.params = np.random.default_rng(0).normal(0, 0.3, policy.params.size)
    prompts, group = world.order[:5], 3
    rng = np.random.default_rng(1)
    success = sigmoid(policy.features[prompts] @ policy.params - world.task.difficulty(0)[prompts])
    rewards = (rng.random((5, group)) < success[:, None]).astype(np.float64)
    styles, advantages = rng.integers(0, SMALL_ENV.num_styles, (5, group)), rng.normal(size=(5, group))
    batch = Rollouts(prompts, success, rewards, styles, policy.style_probs(prompts))
    mine = row_gradient(policy, prompts, np.full(5, group), success, rewards.ravel(), styles.ravel(),
                        batch.style_probs, advantages.ravel())  # fmt: skip
    np.testing.assert_allclose(mine, policy.gradient(batch, advantages), rtol=1e-12, atol=1e-14)


def test_the_summary_writes_and_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = regime_suite.run_suite(SMALL, seeds=2, cache=tmp_path / "runs")
    summary = regime_suite.build_summary(suite, "test command", "test machine")
    assert set(summary.arms) == set(regime.IN_LABS) and summary.revisits["max"] == 1
    assert summary.notes["priors"]["rollouts"] == 8 * 96
    assert set(summary.lr_check) == set(regime_suite.lr_arms(suite.best)) and suite.best in regime.PACKAGE
    path = regime.write_summary(summary, tmp_path)
    again = regime.read_summary(path)
    assert again.arms == summary.arms and again.lr_check == summary.lr_check and again.revisits == summary.revisits
    assert again.notes["spo1_vs_rpp1"] == summary.notes["spo1_vs_rpp1"]
    from instruments.lab.regime_report import PLOT, write_report

    text = write_report(summary, suite, tmp_path, 0.1, "abc1234").read_text()
    counted = "| SPO n=1 + offline priors, priors counted (judged: the start value, arithmetic) |"
    assert counted in text and (tmp_path / PLOT).stat().st_size > 1000
    # issue 37 D: the priors' contrast to their twins, training only and paired by seed, leads; the counted final
    # is each seed's start value (768 prior rollouts against 96 training rollouts)
    contrasts = again.notes["priors"]["minus_twin_training_only"]
    for key, twin in lab_regime.PRIORS_TWINS.items():
        paired = suite.curves(key)[:, -1] - suite.curves(twin)[:, -1]
        assert contrasts[key]["twin"] == twin and contrasts[key]["value"] == pytest.approx(paired.mean())
        np.testing.assert_allclose(regime.final_with_priors(suite.curves(key), suite.x, suite.prior_rollouts),
                                   suite.curves(key)[:, 0])  # fmt: skip
    assert again.notes["priors"]["counted_final_is_start"]
    assert text.index("## What the priors bought") < text.index("## Every arm") and "one-off cost" in text

    def no_run(spec: RegimeSpec) -> None:
        raise AssertionError(f"ran {spec} again: it was in the cache")

    monkeypatch.setattr(regime_suite, "run_regime", no_run)
    resumed = regime_suite.run_suite(SMALL, seeds=2, cache=tmp_path / "runs")
    assert resumed.best == suite.best and set(resumed.results) == set(suite.results)
    assert suite.ran == len(suite.results) == 2 * (len(regime.IN_LABS) + 2 * len(regime_suite.lr_arms(suite.best)))
    assert resumed.ran == 0
