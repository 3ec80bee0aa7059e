"""A tiny suite end to end: result files, resume (finished runs are skipped), refusal of a folder made with other
settings, unavailable arms reported, a failing run recorded, and the report with its plots written."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from instruments.lab.token import arms, runner
from instruments.lab.token import run as run_module
from instruments.lab.token.report import write_report
from instruments.lab.token.store import SettingsMismatch, Store, run_name
from instruments.lab.token.suites import Suite
from tests.lab_token.conftest import TINY

SUITE = Suite("quick", TINY, ("grpo8", "bv2", "rpp1", "ghost"), (0, 1), (1e-4,))


@pytest.fixture(autouse=True)
def ghost_arm(monkeypatch):
    """An arm whose estimator this installation does not have: reported as unavailable, the rest runs."""
    monkeypatch.setitem(arms.ARMS, "ghost", arms.TokenArm("ghost", "ghost estimator", "no_such_estimator", n=1))


@pytest.fixture()
def out(tmp_path, tiny_cache) -> Path:
    """An output folder whose warm-up cache is the session's tiny model (copied: the suite owns its folder)."""
    shutil.copytree(tiny_cache, tmp_path / "out" / "warmup")
    return tmp_path / "out"


def _count_runs(monkeypatch) -> list[tuple[str, int]]:
    calls = []
    real = run_module.run

    def counting(settings, arm, seed, lr, cache, on_step=None):
        calls.append((arm.key, seed))
        return real(settings, arm, seed, lr, cache, on_step)

    monkeypatch.setattr(run_module, "run", counting)
    return calls


def test_a_suite_runs_resumes_and_reports(out, random_scores, monkeypatch):
    calls = _count_runs(monkeypatch)
    results = runner.run_suite(SUITE, out, jobs=1, log=lambda line: None)
    assert sorted(calls) == [(k, s) for k in ("bv2", "grpo8", "rpp1") for s in (0, 1)]
    assert set(results.unavailable) == {"ghost"}
    assert all(len(results.runs(k)) == 2 for k in ("grpo8", "bv2", "rpp1"))
    assert len(list((out / "runs").glob("*.json"))) == 6 and not list((out / "runs").glob(".*"))

    calls.clear()
    runner.run_suite(SUITE, out, jobs=1, log=lambda line: None)
    assert calls == []  # every run finished: nothing runs again

    (out / "runs" / run_name("bv2", 1, 1e-4)).unlink()
    runner.run_suite(SUITE, out, jobs=1, log=lambda line: None)
    assert calls == [("bv2", 1)]

    path = write_report(runner.collect(SUITE, out), None, out / "lab_token.md")
    text = path.read_text()
    for label in ("GRPO n=8", "BV-Blend n=2 (cluster history)", "REINFORCE++ n=1 (batch baseline)"):
        assert f"| {label} | 2 |" in text
    assert "unavailable: verl has no advantage estimator 'no_such_estimator'" in text
    assert "rollouts to reach" in text and "Settings frozen before the first comparison" in text
    assert (out / "lab_token_curves.png").stat().st_size > 0 and (out / "lab_token_differences.png").is_file()


def test_a_folder_made_with_other_settings_is_refused(out, random_scores):
    small = replace(SUITE, arms=("grpo8",), seeds=(0,))
    runner.run_suite(small, out, jobs=1, log=lambda line: None)
    other = replace(small, settings=replace(TINY, steps=3))
    with pytest.raises(SettingsMismatch, match="steps"):
        runner.run_suite(other, out, jobs=1, log=lambda line: None)
    with pytest.raises(SettingsMismatch, match="suite"):
        runner.run_suite(replace(small, name="full"), out, jobs=1, log=lambda line: None)


def test_a_run_file_of_another_arm_definition_is_refused(out, random_scores):
    small = replace(SUITE, arms=("grpo8",), seeds=(0,))
    runner.run_suite(small, out, jobs=1, log=lambda line: None)
    path = out / "runs" / run_name("grpo8", 0, 1e-4)
    data = json.loads(path.read_text())
    data["arm"]["n"] = 4
    path.write_text(json.dumps(data))
    with pytest.raises(SettingsMismatch, match="definition changed"):
        Store(out).load(arms.ARMS["grpo8"], 0, 1e-4)


def test_a_failing_run_is_recorded_and_the_suite_goes_on(out, random_scores, monkeypatch):
    real = run_module.run

    def failing(settings, arm, seed, lr, cache, on_step=None):
        if seed == 1:
            raise FloatingPointError("non-finite advantages at step 1")
        return real(settings, arm, seed, lr, cache, on_step)

    monkeypatch.setattr(run_module, "run", failing)
    results = runner.run_suite(replace(SUITE, arms=("grpo8",)), out, jobs=1, log=lambda line: None)
    assert [r.seed for r in results.runs("grpo8")] == [0]
    assert list(results.failures) == [run_name("grpo8", 1, 1e-4)]
    assert "FloatingPointError" in results.failures[run_name("grpo8", 1, 1e-4)]


def test_the_selection_freezes_a_learning_rate_and_a_step_count(out, random_scores):
    from instruments.lab.token.freeze import frozen_settings

    settings = replace(TINY, steps=4)
    suite = Suite("select", settings, ("grpo8",), (100, 101), (1e-4, 2e-4))
    results = runner.run_suite(suite, out, jobs=1, log=lambda line: None)
    frozen = frozen_settings(results)
    assert frozen["lr"] in (1e-4, 2e-4) and frozen["steps"] == 4
    assert [row["lr"] for row in frozen["selection"]["table"]] == [1e-4, 2e-4]
    assert frozen["selection"]["seeds"] == [100, 101]
    text = write_report(results, None, out / "select.md", frozen).read_text()
    assert "Settings frozen by this selection" in text and "(chosen)" in text
    assert (out / "select_curves.png").is_file()
