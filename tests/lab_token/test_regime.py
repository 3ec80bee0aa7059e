"""The token lab's no-revisit regime on tiny settings: every regime arm runs, no prompt is drawn twice, the clusters
are the package's codebook of the pool, the priors are the package's file, the limits do what results/regime.md says,
and the summary for the rule is written and reads back.

The tiny model never scores, so training rollouts get coin-flip scores (conftest.random_scores); what is tested is
the plumbing and the regime's invariants, not what anything learns.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from bv_blend.history.priors import load_priors
from instruments import regime as shared
from instruments.lab.token import assets, runner, suites
from instruments.lab.token import regime as token_regime
from instruments.lab.token import run as run_module
from instruments.lab.token.arms import REGIME_ARMS, TokenArm, unavailable_reason
from instruments.lab.token.suites import Suite
from tests.lab_token.conftest import TINY, coin_flip_scores

# one worker runs this module: its module fixture is costly, and pytest-xdist would build it again on every
# worker that gets one of its tests (scripts/test.sh: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("lab_token_regime")

SETTINGS = replace(TINY, task="wide", clusters="codebook", pool_size=16, oracle_samples=2, prior_samples=2)
SUITE = Suite("regime", SETTINGS, tuple(REGIME_ARMS), (0, 1), (1e-4,), catalog="regime")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[runner.SuiteResults, Path]:
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("regime")
    with pytest.MonkeyPatch.context() as patch:
        coin_flip_scores(patch)
        results = runner.run_suite(SUITE, out, jobs=1, lr_sweep="regime", log=lambda line: None)
    return results, out


def test_the_regime_arms_are_the_shared_declaration():
    assert set(REGIME_ARMS) == set(shared.IN_LABS)
    assert all(REGIME_ARMS[key].n == arm.n for key, arm in shared.IN_LABS.items())
    assert {key for key, arm in REGIME_ARMS.items() if arm.oracle} == shared.LIMITS
    assert {key for key, arm in REGIME_ARMS.items() if arm.priors} == {k for k, a in shared.IN_LABS.items() if a.priors}


def test_the_model_is_warmed_up_on_the_regime_s_task(finished):
    _, out = finished
    assert SETTINGS.standin(str(out / "warmup")).task == "wide"
    assert list((out / "warmup").glob("warmup*_wide.pt"))


def test_every_arm_runs_and_no_prompt_is_drawn_twice(finished):
    results, _ = finished
    assert not results.unavailable and not results.failures
    assert all(results.complete(key) for key in SUITE.arms)
    for key in SUITE.arms:
        for record in results.runs(key):
            assert max(record.visits) == 1, key


def test_the_clusters_are_the_codebook_of_the_pool(finished):
    _, out = finished
    saved = json.loads(assets.clusters_path(SETTINGS, out / "warmup").read_text())
    pool = run_module.pool_of(SETTINGS, run_module.held_out(SETTINGS))
    assert set(saved["clusters"]) == {p.question for p in pool}
    assert set(saved["clusters"].values()) <= set(range(SETTINGS.num_clusters))
    assert 0.0 <= saved["nmi_vs_families"] <= 1.0 and sum(saved["sizes"]) == len(pool)


def test_the_priors_are_the_package_s_file_over_the_pool(finished):
    _, out = finished
    priors = load_priors(assets.priors_path(SETTINGS, out / "warmup"), "prior_file")
    pool = run_module.pool_of(SETTINGS, run_module.held_out(SETTINGS))
    assert set(priors) == {p.question for p in pool}
    assert all(len(scores) == SETTINGS.prior_samples for scores in priors.values())


def test_the_oracle_allocation_spends_the_budget_in_groups_of_its_sizes(tiny_cache, random_scores, tmp_path):
    cache = tmp_path / "warmup"
    shutil.copytree(tiny_cache, cache)
    settings = replace(SETTINGS, clusters="family")
    steps = []
    run_module.run(settings, REGIME_ARMS["knapsack_grpo2"], 0, 1e-4, str(cache), on_step=steps.append)
    assert len(steps) == settings.steps
    for step in steps:
        sizes = np.unique(step["uids"], return_counts=True)[1]
        assert sizes.sum() == settings.budget and all(2 <= s <= 16 for s in sizes)


def test_the_oracle_baseline_is_reward_minus_p(tiny_cache, random_scores, tmp_path, monkeypatch):
    cache = tmp_path / "warmup"
    shutil.copytree(tiny_cache, cache)
    estimates = []  # the real estimator (oracle_samples=2: cheap), recorded

    def recorded(*args, real=run_module.estimated_success):
        estimates.append(real(*args))
        return estimates[-1]

    monkeypatch.setattr(run_module, "estimated_success", recorded)
    steps = []
    settings = replace(SETTINGS, clusters="family")
    run_module.run(settings, REGIME_ARMS["oracle_baseline1"], 0, 1e-4, str(cache), on_step=steps.append)
    step, p_hat = steps[0], torch.as_tensor(estimates[0], dtype=steps[0]["rollouts"].scores.dtype)
    assert len(p_hat) == len(step["rollouts"].scores)  # one rollout a prompt
    expected = (step["rollouts"].scores - p_hat)[:, None] * step["rollouts"].response_mask
    assert np.allclose(step["advantages"].numpy(), expected.numpy())


def test_the_summary_is_written_for_the_rule_and_reads_back(finished, tmp_path):
    results, out = finished
    path = token_regime.write(results, None, out, tmp_path / "token_lab.md")
    found = shared.read_summary(tmp_path / "token_lab.json")
    assert set(found.arms) == set(SUITE.arms) and found.revisits["max"] == 1
    assert found.arms["spo1_priors"].training_only is not None and found.arms["rpp1"].training_only is None
    # the priors' rollouts counted: the budget of 2 steps x 8 is spent before training, so the start value is judged
    start = np.array([r.pass_rate[0] for r in results.runs("spo1_priors")])
    assert found.arms["spo1_priors"].final.value == pytest.approx(start.mean())
    assert set(found.lr_check) == set(token_regime.lr_check_keys(results)) - {"grpo8"}
    assert all(set(by_factor) == {"x0.5", "x2"} for by_factor in found.lr_check.values())
    assert "## Arms" in path.read_text() and (tmp_path / "token_lab_curves.png").is_file()


def test_an_arm_left_out_is_in_the_summary_with_its_reason(finished, tmp_path):
    """Issue 37 F: an arm whose probe fails is dropped from the tables, and the committed summary says why."""
    results, out = finished
    reason = unavailable_reason(TokenArm("rpp1", "REINFORCE++ n=1", "no_such_estimator", n=1))
    assert reason is not None
    dropped = replace(results, records={k: v for k, v in results.records.items() if k != "rpp1"},
                      unavailable={"rpp1": reason})  # what collect() holds when rpp1's probe raises
    path = token_regime.write(dropped, None, out, tmp_path / "token_lab.md")
    found = shared.read_summary(tmp_path / "token_lab.json")
    assert "rpp1" not in found.arms
    assert found.notes["unavailable"] == {"rpp1": reason}
    assert f"REINFORCE++ n=1: {reason}" in path.read_text()


def test_a_no_revisit_suite_whose_pool_is_too_small_is_refused(tmp_path):
    """Issue 37 F: steps x the most prompts an arm takes a step must fit in the pool, or a prompt comes back."""
    suite = replace(SUITE, settings=replace(SETTINGS, steps=3))  # rpp1 takes 8 a step: 24 prompts, the pool has 16
    with pytest.raises(ValueError, match=r"3 steps x 8 = 24 prompts, but the pool holds 16.*at least 24.*steps to 2"):
        runner.run_suite(suite, tmp_path / "out", log=lambda line: None)
    assert not (tmp_path / "out").exists()  # refused before the folder is claimed
    SUITE.check()
    regime_suite = suites.regime({"lr": 1e-4, "steps": 80})
    regime_suite.check()  # the committed regime: 80 steps x 64 = the pool of 5,120
    smaller = replace(regime_suite, settings=replace(regime_suite.settings, pool_size=4992))
    with pytest.raises(ValueError, match="80 steps x 64 = 5120 prompts, but the pool holds 4992.*steps to 78"):
        smaller.check()


def test_the_priors_arms_lead_with_their_contrast_to_their_twin(finished, tmp_path):
    """Issue 37 D: each priors arm minus its twin, training only, paired by seed, in the summary and first in the
    report; the counted figure is said to be the start value."""
    results, out = finished
    path = token_regime.write(results, None, out, tmp_path / "token_lab.md")
    notes = shared.read_summary(tmp_path / "token_lab.json").notes["priors_minus_twin"]
    assert set(notes) == {"spo1_priors", "bv2_priors"}
    for key, twin in (("spo1_priors", "spo1"), ("bv2_priors", "bv_cluster2")):
        paired = [a.pass_rate[-1] - b.pass_rate[-1] for a, b in zip(results.runs(key), results.runs(twin), strict=True)]
        assert notes[key]["twin"] == twin
        assert notes[key]["training_only_minus_twin"][0] == pytest.approx(np.mean(paired))
        assert notes[key]["counted_final_is_start"]  # 2 x 8 prior samples on a pool of 16 >= 2 steps x 8 rollouts
    text = path.read_text()
    assert text.index("## What the priors bought") < text.index("## Arms")
    assert "one-off cost" in text and "(counted: the start value, arithmetic)" in text
