"""Experiments pair arms by seed, skip what cannot run with a reason, match step sizes, and write the report."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from instruments.lab.estimators import ESTIMATORS, EstimatorSpec
from instruments.lab.experiments import Experiment, run_experiments
from instruments.lab.report import RunInfo, write_report
from instruments.lab.run import run
from instruments.lab.suites import SUITES, Suite, arms
from tests.instruments.lab._helpers import SMALL

STEPS, SEEDS, PILOT = 8, 2, 4


def test_matched_experiment_and_its_report(tmp_path):
    missing = EstimatorSpec("Not installed", "no_such_estimator")
    experiment = Experiment(
        "main", "tiny", arms([ESTIMATORS["grpo"], ESTIMATORS["bv_sem"], missing], STEPS, env=SMALL), matched=True
    )
    notes: list[str] = []
    (result,) = run_experiments([experiment], SEEDS, PILOT, jobs=1, log=notes.append)
    assert "no_such_estimator" in result.skipped["Not installed"] and len(notes) == 1
    assert set(result.arms) == set(result.matched) == {"GRPO", "BV-Blend sem (defaults)"}

    # The lr scale is the reference's mean pilot update norm over the arm's, and the matched runs use it.
    grpo, bv = (a for a in experiment.arms[:2])
    pilot = {
        arm.label: np.mean([run(replace(arm.spec, seed=s, steps=PILOT)).update_norm.mean() for s in range(SEEDS)])
        for arm in (grpo, bv)
    }
    assert result.matched["GRPO"].lr_scale == 1.0
    assert result.matched[bv.label].lr_scale == pytest.approx(pilot["GRPO"] / pilot[bv.label], rel=1e-12)
    rerun = run(replace(bv.spec, seed=1, lr_scale=result.matched[bv.label].lr_scale))
    np.testing.assert_array_equal(result.matched[bv.label].runs[1].success, rerun.success)

    suite = Suite("test", STEPS, SEEDS, PILOT, (experiment,))
    info = RunInfo("python scripts/lab.py --suite test", 1.0, 1, "test machine", "versions")
    text = write_report(suite, [result], info, tmp_path).read_text()
    assert "| GRPO | " in text and "skipped **Not installed**" in text and "Bias against the true advantage" in text
    assert "Step-size matched" in text
    for name in ("main_delta.png", "main_curves.png", "bias.png", "abs_advantage.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert "Wall time 0.0 min with 1 process(es)." in text
    resumed = replace(info, runs=8, runs_from_earlier=6)  # a resumed suite says its wall time is not the whole cost
    resumed_text = write_report(suite, [result], resumed, tmp_path).read_text()
    assert "6 of its 8 runs were finished by earlier ones" in resumed_text


@pytest.mark.parametrize("name", sorted(SUITES))
def test_suites_are_well_formed(name):
    suite = SUITES[name]()
    assert suite.seeds >= 10
    for experiment in suite.experiments:
        labels = [arm.label for arm in experiment.arms]
        assert len(labels) == len(set(labels)), experiment.key
        for arm in experiment.arms:
            assert arm.reference is None or arm.reference in labels, (experiment.key, arm.label)
            assert arm.spec.env.rollouts_per_step == 128  # a fixed rollout budget everywhere


def test_a_rerun_with_the_same_cache_reads_every_run_and_runs_none(tmp_path, monkeypatch):
    from instruments.lab import experiments as experiments_module

    experiment = Experiment("main", "tiny", arms([ESTIMATORS["grpo"], ESTIMATORS["bv_sem"]], STEPS, env=SMALL))
    (first,) = run_experiments([experiment], SEEDS, PILOT, jobs=1, log=lambda _: None, cache=tmp_path)
    assert len(list(tmp_path.glob("*.pkl"))) == 2 * SEEDS and not list(tmp_path.glob("*.tmp"))

    def no_run(spec):
        raise AssertionError(f"ran {spec} again: it was in the cache")

    monkeypatch.setattr(experiments_module, "run", no_run)
    (again,) = run_experiments([experiment], SEEDS, PILOT, jobs=1, log=lambda _: None, cache=tmp_path)
    for label, arm in first.arms.items():
        for mine, theirs in zip(arm.runs, again.arms[label].runs, strict=True):
            np.testing.assert_array_equal(mine.success, theirs.success)
    longer = replace(experiment, arms=tuple(replace(a, spec=replace(a.spec, steps=STEPS + 1)) for a in experiment.arms))
    with pytest.raises(AssertionError, match="ran RunSpec"):  # another setting is another run, never a cached one
        run_experiments([longer], SEEDS, PILOT, jobs=1, log=lambda _: None, cache=tmp_path)


def test_a_limit_share_is_given_only_where_the_limit_is_ahead_of_its_base():
    from types import SimpleNamespace

    from instruments.lab.budget import BudgetArm, _limits

    def summary(estimator: str, size: int, auc: list[float]) -> tuple[str, SimpleNamespace]:
        return BudgetArm(estimator, "", size).label, SimpleNamespace(auc=auc)

    noise = [0.01, -0.01, 0.02, -0.02, 0.0]
    summaries = dict([
        summary("grpo", 2, [0.30] * 5), summary("oracle", 2, [0.34] * 5), summary("spo", 2, [0.33] * 5),
        # at G=8 the oracle is level with GRPO (noise around it): a share would divide noise by noise
        summary("grpo", 8, [0.30] * 5), summary("oracle", 8, [0.30 + e for e in noise]),
        summary("spo", 8, [0.31] * 5),
    ])
    spo_rows = [line for line in _limits(summaries) if line.startswith("| ") and "| SPO |" in line]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in spo_rows}
    assert rows["2"].endswith("| +0.75 |")  # (0.33 - 0.30) / (0.34 - 0.30)
    assert "none (the limit is not ahead of the base)" in rows["8"]
