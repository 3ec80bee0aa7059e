"""instruments/fair_verdict_report.py and scripts/fair_verdict_report.py: the report assembled from whatever state
exists, on a made-up state (tuning half done, seeds missing, a cold start with group records) and on the committed
comparison."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from scipy import stats as scipy_stats

from instruments import campaign, fair_verdict, stats, tuning
from instruments import fair_verdict_report as fvr
from tests._scripts import load_script

STEPS = 20


def _save(folder: Path, arm: str, seed: int, lr: float, validation: dict[int, float], groups: list[dict] | None = None,
          ) -> None:
    """A finished run's state as run_state.py keeps it: ``folder/runs/<arm>_n<n>_seed<s>/result.json``."""
    name, n = arm.split(":")
    run = folder / "runs" / fair_verdict.run_folder(arm, seed)
    run.mkdir(parents=True)
    result = {"spec": {"arm": name, "n": int(n), "batch": 64 // int(n), "seed": seed, "estimator": name,
                       "overrides": []},
              "settings": {"lr": f"{lr:g}", "steps": str(max(validation))},
              "validation": {str(k): v for k, v in validation.items()}, "cpu": "cpu A", "wall_s": 100.0}
    (run / "result.json").write_text(json.dumps(result))
    if groups is not None:
        (run / "groups.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups))


def _groups(history: bool) -> list[dict]:
    lines = []
    for step in (1, 2):
        for rewards in ([0.0, 0.0], [1.0, 0.0]):
            line = {"step": step, "prompt_key": "k", "cluster": 0, "rewards": rewards, "advantages": [0.0, 0.0]}
            if history:
                line.update(history_mean=0.1 * step, history_weight=0.5)
            lines.append(line)
    return lines


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A results/regime/ laid out as instruments/fair_verdict.py says, part way through the campaign."""
    regime = tmp_path / "regime"
    committed, tuned = regime / campaign.COMMITTED, regime / campaign.TUNING
    cold_arms = regime / campaign.COLD_ARMS_STATE
    for seed in range(5):  # the committed comparison: BV-Blend n = 2 ahead on every seed, REINFORCE++ on 3 seeds
        _save(committed, "grpo:8", seed, 2e-5, {0: 0.1, 10: 0.3, 20: 0.60 + 0.01 * seed})
        _save(committed, "bv_blend:2", seed, 2e-5, {0: 0.1, 10: 0.4, 20: 0.65 + 0.012 * seed})
        if seed < 3:
            _save(committed, "reinforce_plus_plus:1", seed, 2e-5, {0: 0.1, 10: 0.3, 20: 0.7})
    for lr, final in {1e-5: 0.60, 2e-5: 0.70, 4e-5: 0.65}.items():  # GRPO's tuning done: 2e-5, interior
        for seed in tuning.TUNING_SEEDS:
            _save(tuned / "grpo_n8" / fair_verdict.lr_folder(lr), "grpo:8", seed, lr, {0: 0.1, 10: 0.3, STEPS: final})
    _save(tuned / "reinforce_plus_plus_n1" / "lr_1e-05", "reinforce_plus_plus:1", 100, 1e-5,
          {0: 0.1, 10: 0.3, STEPS: 0.6})
    for seed in tuning.TUNING_SEEDS:  # the cold task: starts at 0.025, ends at 0.15, accepted at 20 steps
        _save(regime / campaign.COLD_SELECTION / "steps_20", "grpo:8", seed, 2e-5,
              {0: 0.02 if seed == 100 else 0.03, 10: 0.1, 20: 0.2 if seed == 100 else 0.1})
    for seed in range(5):
        _save(cold_arms / "grpo_n8" / "lr_2e-05", "grpo:8", seed, 2e-5, {0: 0.02, 10: 0.1, 20: 0.2}, _groups(False))
        _save(cold_arms / "bv_blend_n2" / "lr_2e-05", "bv_blend:2", seed, 2e-5,
              {0: 0.02, 10: 0.15, 20: 0.25 + 0.01 * seed}, _groups(True))
    return regime


def _row(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


def test_the_tuning_table_and_what_it_still_needs(state):
    done = fvr.tuning_state("grpo:8", state / campaign.TUNING / "grpo_n8", STEPS)
    assert done.lr == 2e-5 and not done.needs
    text = "\n".join(fvr.tuning_lines(done))
    assert "**Chosen: 2e-05**, interior" in text and "| 2e-05 | 0.700 | 0.700 | 0.700 | 0.700 |" in text
    assert "| 4e-05 | 0.650 | 0.650 | 0.650 | 0.650 |" in text and "has not written `choice.json`" in text
    partial = fvr.tuning_state("reinforce_plus_plus:1", state / campaign.TUNING / "reinforce_plus_plus_n1", STEPS)
    text = "\n".join(fvr.tuning_lines(partial))
    assert "| 1e-05 | 0.600 | - | 0.600 | - |" in text
    assert "still needs lr 2e-05 seed 100, lr 4e-05 seed 100" in text


def test_the_report_judges_with_five_seeds_and_says_pending_below(state, tmp_path):
    text = fvr.report_markdown(tmp_path / "out", state, STEPS)
    bv2 = _row(text, "| bv_blend n=2 (32 prompts) | 0.")
    diffs = np.array([0.05 + 0.002 * s for s in range(5)])
    direct = stats.format_interval(stats.Interval(diffs.mean(), *(diffs.mean() + np.array([-1, 1]) * scipy_stats.t.ppf(
        0.975, 4) * diffs.std(ddof=1) / np.sqrt(5))), signed=True)
    assert f"| {direct} | ahead |" in bv2
    assert "pending (3 of 5 seeds)" in _row(text, "| reinforce_plus_plus n=1 (64 prompts) | 0.")
    # GRPO chose 2e-5: its committed runs count at its own rate; the others have no rate of their own yet
    grpo = _row(text, "| grpo n=8 (8 prompts) |")
    assert "| 2e-05 | 0.620 [" in grpo
    assert "no rate of its own yet: its tuning has not chosen" in bv2
    assert (tmp_path / "out" / "curves_grpo_rate.png").is_file()
    assert "No run of this comparison kept a group record" in text
    assert "Pending: only GRPO n = 8, the reference, has runs here" in text  # at its own rate, alone so far


def test_the_cold_start_is_accepted_and_its_group_record_read(state, tmp_path):
    text = fvr.report_markdown(tmp_path / "out", state, STEPS)
    assert "**Accepted**: accepted at 20 steps" in text
    assert "| 20 | 0.020 -> 0.200 | 0.030 -> 0.100 |" in text
    # every step: one all-wrong group of two; BV-Blend's lag at step 1: 0.1 - 1/4, at step 2: 0.2 - 1/4
    assert _row(text, "| bv_blend n=2 (32 prompts) | 5 | 0.500 -> 0.500 |").endswith(
        "| -0.150 -> -0.050 | 0.500 -> 0.500 |")
    assert _row(text, "| grpo n=8 (8 prompts) | 5 | 0.500 -> 0.500 |").endswith("| no history | no history |")
    assert "| 1 | 0.500 | 0.500 | -0.150 (0.50) |" in text and "| 2 | 0.500 | 0.500 | -0.050 (0.50) |" in text
    assert (tmp_path / "out" / "mechanisms_cold_start.png").is_file()
    assert (tmp_path / "out" / "curves_cold_start.png").is_file()
    assert "pending: no run finished" in _row(text, "| reinforce_plus_plus n=1 (64 prompts) | - |")


def test_nothing_run_is_pending_everywhere(tmp_path):
    text = fvr.report_markdown(tmp_path / "out", tmp_path / "empty", STEPS)
    assert text.count("No finished run yet") == len(fair_verdict.TUNED_ARMS)
    assert "the selection runs GRPO n = 8 at its own learning rate, which its tuning has not chosen yet" in text
    assert "Pending: no cold-start arm has finished a run" in text
    assert "### 3.1. At GRPO's learning rate\n\nPending: no run has finished." in text


def test_the_script_reads_the_committed_comparison(tmp_path):
    """DAPO at equal steps against a direct computation from the committed results: each seed's validation at step
    20 minus GRPO n = 8's, and the t-interval of those five differences."""
    assert load_script("fair_verdict_report").main(["--out", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    runs = fair_verdict.COMMITTED / "runs"
    read = lambda arm, s: json.loads((runs / f"{arm}_seed{s}" / "result.json").read_text())["validation"]["20"]  # noqa: E731
    diffs = np.array([read("grpo_dynamic_n8", s) - read("grpo_n8", s) for s in range(5)])
    half = scipy_stats.t.ppf(0.975, 4) * diffs.std(ddof=1) / np.sqrt(5)
    expected = f"{diffs.mean():+.3f} [{diffs.mean() - half:+.3f}, {diffs.mean() + half:+.3f}]"
    assert f"| equal steps | 5 | {expected} |" in text
    assert "| equal wall time | 2 |" in text and "seed 2: no metrics kept by the reference" in text
    assert (tmp_path / "curves_grpo_rate.png").is_file()
    # the first tuning run (GRPO n = 8, 1e-5, seed 100): 46cc1f7, after a first attempt at 6b7b822 replaced at step 0,
    # both after the design (9b8da05), both before amendments 1 (b9f88c9, added while it ran) and 2 (2161c46)
    row = _row((tmp_path / "runs.md").read_text(), "| tuning | grpo n=8 (8 prompts) | 1e-05 | 100 |")
    assert "1. `46cc1f7`, clean tree," in row and "reached step 0: `6b7b822`, clean tree," in row
    known = subprocess.run(["git", "cat-file", "-e", "9b8da05^{commit}"], cwd=fair_verdict.ROOT,
                           capture_output=True).returncode == 0 if shutil.which("git") else False
    assert row.endswith("| yes | yes | no | no |" if known else "| unknown | unknown | unknown | unknown |")
    assert (tmp_path / "tuning.png").is_file() and "](tuning.png)" in text
    # the committed report's readings at GRPO's rate (what the README quotes) are what the code makes of the runs
    section = lambda t: t[t.index("### 3.1."):t.index("### 3.2.")]  # noqa: E731
    assert section((fair_verdict.REPORT / "report.md").read_text()) == section(text), \
        "results/fair_verdict/report.md is stale: python scripts/fair_verdict_report.py rewrites it"


# ------------------------------------------------------------------------------- DAPO stopped at its budget
# The cold start's DAPO (fair_verdict.md, amendment 1): 64 + 8 x extra rollouts a step, stopped at the first step that
# reaches GRPO's 64 x 20 = 1,280. Seeds 0-3 draw 15 extra groups a step (184 rollouts: 920 by step 5, 1,288 by step 7,
# where they stop); seed 4 draws 11 (152: 760 by step 5, 1,368 by step 9).
DAPO_STOPS = {0: (15, 7), 1: (15, 7), 2: (15, 7), 3: (15, 7), 4: (11, 9)}


def _dapo(seed: int) -> dict[int, float]:
    return {0: 0.02, 5: 0.1 + 0.01 * seed, DAPO_STOPS[seed][1]: 0.2 + 0.01 * seed}


@pytest.fixture
def cold_dapo(state: Path) -> Path:
    """The made-up state, with DAPO's five cold seeds stopped at the budget (GRPO's cold runs: 0.02, 0.1, 0.2 at steps
    0, 10, 20)."""
    folder = state / campaign.COLD_ARMS_STATE / "grpo_dynamic_n8" / "lr_2e-05"
    for seed, (extra, step) in DAPO_STOPS.items():
        _save(folder, "grpo_dynamic:8", seed, 2e-5, _dapo(seed))
        path = folder / "runs" / fair_verdict.run_folder("grpo_dynamic:8", seed) / "result.json"
        result = json.loads(path.read_text())
        result["settings"] |= {"steps": "20", "stop_at_rollouts": "1280"}
        result["filter_groups"] = {"evicted_samples": {str(k): float(extra) for k in range(1, step + 1)}}
        result["stopped"] = {"reason": "rollout budget", "step": step, "rollouts": float((64 + 8 * extra) * step),
                             "stop_at_rollouts": 1280, "steps": 20}
        path.write_text(json.dumps(result))
    return state


def _interval(diffs: np.ndarray) -> str:
    half = scipy_stats.t.ppf(0.975, len(diffs) - 1) * diffs.std(ddof=1) / np.sqrt(len(diffs))
    return f"{diffs.mean():+.3f} [{diffs.mean() - half:+.3f}, {diffs.mean() + half:+.3f}]"


def test_dapo_stopped_at_the_budget_is_read_where_it_stopped(cold_dapo, tmp_path):
    text = fvr.report_markdown(tmp_path / "out", cold_dapo, STEPS)
    # per seed: the step it stopped at, the rollouts it generated, the budget and its final there
    assert "| 0 | 7 | 20 | 1,288 | 1,280 | 0.200 |" in text and "| 4 | 9 | 20 | 1,368 | 1,280 | 0.240 |" in text
    # the rule's reading: each seed's own curve read at 1,280 rollouts, minus GRPO's final (0.2)
    def at_budget(seed: int) -> float:  # linear between its step-5 validation and its last, on its own rollouts
        extra, step = DAPO_STOPS[seed]
        per_step, values = 64 + 8 * extra, _dapo(seed)
        return values[5] + (1280 - 5 * per_step) / ((step - 5) * per_step) * (values[step] - values[5])

    assert at_budget(0) == pytest.approx(0.1 + 360 / 368 * 0.1)  # 920 -> 1,288 rollouts
    at_budget = np.array([at_budget(s) for s in range(5)])
    assert f"| {_interval(at_budget - 0.2)} |" in _row(text, "| grpo_dynamic n=8 (8 prompts) | 2e-05 |")
    # equal steps: its final minus GRPO's curve at the same step (step 7: 0.02 + 0.7 x 0.08; step 9: + 0.9 x 0.08)
    grpo_at = {7: 0.02 + 0.7 * 0.08, 9: 0.02 + 0.9 * 0.08}
    equal_steps = np.array([0.2 + 0.01 * s - grpo_at[DAPO_STOPS[s][1]] for s in range(5)])
    row = _row(text, "| equal steps (at the step it reached) | 5 |")
    assert f"| {_interval(equal_steps)} |" in row and "seed 0: step 7" in row and "seed 4: step 9" in row
    assert "| equal wall time | 0 | n/a |" in text  # no metrics kept here: left out, as it is
    assert "which end at the step each run stopped at (seed 0: 7" in text  # last two and AUC: said what they are
    assert (tmp_path / "out" / "curves_cold_start.png").is_file()


# ------------------------------------------------------------------------------------------- the tuning plot
def test_the_tuning_plot_draws_each_seed_the_mean_and_the_choice(tmp_path):
    regime = tmp_path / "regime"
    finals = {1e-5: (0.5, 0.6), 2e-5: (0.7, 0.8), 4e-5: (0.6, 0.62)}  # chosen: 2e-5, interior on both seeds
    for lr, by_seed in finals.items():
        for seed, final in zip(tuning.TUNING_SEEDS, by_seed, strict=True):
            _save(regime / campaign.TUNING / "grpo_n8" / fair_verdict.lr_folder(lr), "grpo:8", seed, lr,
                  {0: 0.1, 10: 0.3, STEPS: final})
    _save(regime / campaign.TUNING / "bv_blend_n2" / "lr_2e-05", "bv_blend:2", 100, 2e-5, {0: 0.1, 10: 0.3, STEPS: 0.4})
    states = {arm: fvr.tuning_state(arm, regime / campaign.TUNING / fair_verdict.arm_folder(arm), STEPS)
              for arm in fair_verdict.TUNED_ARMS}
    fig = fvr.tuning_figure(states, STEPS)
    grpo, bv2 = fig.axes  # one panel per arm with a finished tuning run, in the tuning's order
    assert grpo.get_title() == "grpo n=8 (8 prompts)" and bv2.get_title() == "bv_blend n=2 (32 prompts)"
    assert grpo.get_xscale() == "log" and grpo.xaxis.get_transform().base == 2
    seeds = [c.get_offsets().tolist() for c in grpo.collections if isinstance(c, PathCollection)]
    assert seeds == [[[1e-5, 0.5], [2e-5, 0.7], [4e-5, 0.6]], [[1e-5, 0.6], [2e-5, 0.8], [4e-5, 0.62]]]
    mean, chosen = grpo.get_lines()
    assert list(mean.get_xdata()) == [1e-5, 2e-5, 4e-5]
    assert list(mean.get_ydata()) == pytest.approx([0.55, 0.75, 0.61])
    assert list(chosen.get_xdata()) == [2e-5, 2e-5]
    assert len(bv2.get_lines()) == 1  # its mean alone: it has not chosen
    assert [c.get_offsets().tolist() for c in bv2.collections] == [[[2e-5, 0.4]]]
    text = fvr.report_markdown(tmp_path / "out", regime, STEPS)
    assert "![final held-out pass rate against the learning rate, per tuned arm](tuning.png)" in text
    assert (tmp_path / "out" / "tuning.png").is_file()
    assert fvr.tuning_figure({arm: fvr.tuning_state(arm, tmp_path / "none", STEPS) for arm in states}, STEPS) is None


# ---------------------------------------------------------------------------------------------- provenance
def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[str]]:
    """A git repository of three commits in a line: before the design, the design, after it."""
    if shutil.which("git") is None:
        pytest.skip("no git")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    commits = []
    for name in ("before", "design", "after"):
        _git(repo, "commit", "-q", "--allow-empty", "-m", name)
        commits.append(_git(repo, "rev-parse", "HEAD"))
    return repo, commits


def test_descent_is_read_by_git_and_unknown_where_git_cannot_say(history, tmp_path):
    repo, (before, design, after) = history
    assert fvr.descends(after, design, repo) is True and fvr.descends(design, design, repo) is True
    assert fvr.descends(before, design, repo) is False
    assert fvr.descends("f" * 40, design, repo) is None  # a commit this clone lacks
    assert fvr.descends(None, design, repo) is None  # none recorded
    assert fvr.descends(after, design, tmp_path) is None  # not a repository


def test_a_resumed_runs_attempts_are_read_from_its_result():
    result = {"commit": "a" * 40, "tree_clean": True, "started_utc": "2026-12-06T08:00:00+00:00", "cpu": "CPU: B",
              "resumed_from_steps": [10], "attempt_commits": ["a" * 40, "b" * 40], "attempt_cpus": ["CPU: A", "CPU: B"]}
    first, second = fvr.kept_attempts(result)
    assert (first.commit, first.cpu, first.started_utc, first.from_step, first.tree_clean) == \
        ("a" * 40, "CPU: A", "2026-12-06T08:00:00+00:00", 0, True)
    assert (second.commit, second.cpu, second.started_utc, second.from_step, second.tree_clean) == \
        ("b" * 40, "CPU: B", None, 10, True)  # clean throughout: each was; its start is not kept
    dirty = fvr.kept_attempts(result | {"tree_clean": False})
    assert [a.tree_clean for a in dirty] == [None, None]  # not all clean: which one was is not kept
    alone = fvr.kept_attempts({"commit": "c" * 40, "tree_clean": False, "cpu": "CPU: A", "started_utc": "t"})
    assert [(a.commit, a.tree_clean, a.from_step) for a in alone] == [("c" * 40, False, 0)]
    read_after = fvr.kept_attempts({"commit": "c" * 40, "commit_read": "after the run", "cpu": "CPU: A"})
    assert read_after[0].commit is None  # read after the run: not what it started at
    each = fvr.kept_attempts(result | {"tree_clean": False, "attempt_tree_clean": [True, False],
                                       "attempt_started_utc": ["t0", "t1"]})
    assert [(a.tree_clean, a.started_utc) for a in each] == [(True, "t0"), (False, "t1")]  # kept per attempt


def test_runs_md_lists_every_fair_verdict_run_with_its_commits(history, tmp_path, monkeypatch):
    repo, (before, design, after) = history
    monkeypatch.setattr(fair_verdict, "DESIGN_COMMIT", design[:7])
    monkeypatch.setattr(fair_verdict, "AMENDMENT_COMMITS", {"amendment 1": after[:7]})
    regime = tmp_path / "regime"
    folder = regime / campaign.TUNING / "grpo_n8" / "lr_1e-05"
    for seed in (100, 101):
        _save(folder, "grpo:8", seed, 1e-5, {0: 0.1, 10: 0.3, STEPS: 0.5})
    _save(regime / campaign.COMMITTED, "grpo:8", 0, 2e-5, {0: 0.1, 10: 0.3, STEPS: 0.5})  # not the fair verdict's
    replaced = {"attempts": [{"started_utc": "2026-12-06T07:00:00+00:00", "commit": before, "tree_clean": True,
                              "cpu": "CPU: A", "from_step": 0}], "reached_step": 3}
    records = {  # seed 100: its replaced first attempt ran at a commit before the design; seed 101 resumed, clean
        100: {"commit": after, "tree_clean": True, "started_utc": "2026-12-06T08:00:00+00:00", "cpu": "CPU: A",
              "replaced_attempts": [replaced], "ended_utc": "2026-12-06T09:00:00+00:00"},
        101: {"commit": design, "tree_clean": True, "started_utc": "2026-12-06T10:00:00+00:00", "cpu": "CPU: B",
              "resumed_from_steps": [10], "attempt_commits": [design, after], "attempt_cpus": ["CPU: A", "CPU: B"]}}
    for seed, record in records.items():
        path = folder / "runs" / f"grpo_n8_seed{seed}" / "result.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | record))
    # the runner's launches: seed 100's first (06:00) left nothing in the result, lost with its machine
    launches = [(100, "06:00", "D"), (100, "06:59", "A"), (100, "07:59", "A"), (101, "09:59", "A")]
    (regime / campaign.LAUNCHES).write_text("".join(json.dumps(
        {"result": f"lr_tuning/grpo_n8/lr_1e-05/runs/grpo_n8_seed{seed}/result.json", "run": "r",
         "launched_utc": f"2026-12-06T{time}:00+00:00", "commit": design, "tree_clean": True, "cpu": f"CPU: {cpu}"})
        + "\n" for seed, time, cpu in launches))
    text = fvr.report_markdown(tmp_path / "out", regime, STEPS, repo=repo)
    runs = (tmp_path / "out" / "runs.md").read_text()
    row = {seed: _row(runs, f"| tuning | grpo n=8 (8 prompts) | 1e-05 | {seed} |") for seed in (100, 101)}
    assert len([line for line in runs.splitlines() if line.startswith("| tuning |")]) == 2  # the committed one: not
    assert f"1. `{after[:7]}`, clean tree, A, started 2026-12-06T08:00:00+00:00, from step 0" in row[100]
    assert f"reached step 3: `{before[:7]}`, clean tree, A, started 2026-12-06T07:00:00+00:00, from step 0" in row[100]
    assert (f"launched, no attempt of it kept (lost with its machine): `{design[:7]}`, clean tree, D, launched "
            "2026-12-06T06:00:00+00:00 |") in row[100]
    assert "lost with its machine" not in row[101]  # its launch started the first of its attempts
    assert "| 1.7 min (ended 2026-12-06T09:00:00+00:00) | no (all 20 steps) |" in row[100]  # wall_s 100
    assert row[100].endswith("| **no** | **no** | no |")  # its first attempt, the replaced one, before the design
    assert f"2. `{after[:7]}`, clean tree, B, started at a time not kept, from step 10" in row[101]
    assert row[101].endswith("| yes | yes | no |")  # at the design, then after it; amendment 1 came after its start
    assert ("first attempt started at a commit descending from the design "
            f"(`{design[:7]}`): 1 of 2; **not**: `lr_tuning/grpo_n8/lr_1e-05/runs/grpo_n8_seed100`.") in text
    assert "[runs.md](runs.md)" in text


def test_the_fixture_runs_without_commits_are_unknown(state, tmp_path):
    text = fvr.report_markdown(tmp_path / "out", state, STEPS)
    runs = (tmp_path / "out" / "runs.md").read_text()
    stages = [line.split(" | ")[0] for line in runs.splitlines() if line.startswith("| ") and "|---" not in line][1:]
    # 6 + 1 tuning runs, 2 selection runs, 10 cold runs; none of the committed comparison's
    assert stages == ["| tuning"] * 7 + ["| cold selection"] * 2 + ["| cold start"] * 10
    assert "(tuning 7, cold selection 2, cold start 10)" in text
    assert "commit not read at its start" in runs and "| unknown | unknown | unknown |" in runs


def test_what_is_left_is_timed_at_the_finished_runs_mean_wall(tmp_path):
    """Two finished tuning runs of 30 and 40 min: the rest, however many the plan counts, at 35 min each."""
    regime = tmp_path / "regime"
    for lr, wall in ((1e-5, 1800.0), (2e-5, 2400.0)):
        _save(regime / campaign.TUNING / "grpo_n8" / fair_verdict.lr_folder(lr), "grpo:8", 100, lr,
              {0: 0.1, 10: 0.3, STEPS: 0.5})
        path = regime / campaign.TUNING / "grpo_n8" / fair_verdict.lr_folder(lr) / "runs" / "grpo_n8_seed100"
        result = json.loads((path / "result.json").read_text())
        (path / "result.json").write_text(json.dumps(result | {"wall_s": wall}))
    finished = [run for folder in sorted((regime / campaign.TUNING / "grpo_n8").iterdir())
                for run in fvr.load_runs(folder)]
    left = campaign.plan(regime).estimated
    text = "\n".join(fvr.campaign_lines(regime, finished))
    assert (f"mean wall time on each kind of CPU, 35 min on cpu A (2 runs), that is about {left * 35 / 60:.0f} hours "
            "of one machine.") in text
    assert "mean wall time" not in "\n".join(fvr.campaign_lines(regime))


def test_what_is_left_is_timed_by_kind_of_cpu_where_the_runs_ran_on_several(tmp_path):
    """A 30-min run on one CPU and a 60-min run on another: the rest is timed at each, not at their mean."""
    regime = tmp_path / "regime"
    for lr, wall, cpu in ((1e-5, 1800.0, "CPU: fast"), (2e-5, 3600.0, "CPU: slow")):
        _save(regime / campaign.TUNING / "grpo_n8" / fair_verdict.lr_folder(lr), "grpo:8", 100, lr,
              {0: 0.1, 10: 0.3, STEPS: 0.5})
        path = regime / campaign.TUNING / "grpo_n8" / fair_verdict.lr_folder(lr) / "runs" / "grpo_n8_seed100"
        result = json.loads((path / "result.json").read_text())
        (path / "result.json").write_text(json.dumps(result | {"wall_s": wall, "cpu": cpu}))
    finished = [run for folder in sorted((regime / campaign.TUNING / "grpo_n8").iterdir())
                for run in fvr.load_runs(folder)]
    left = campaign.plan(regime).estimated
    text = "\n".join(fvr.campaign_lines(regime, finished))
    assert (f"30 min on fast (1 run), 60 min on slow (1 run), that is about {left * 30 / 60:.0f} to "
            f"{left * 60 / 60:.0f} hours") in text


def test_each_arm_needs_what_its_regime_arm_needs_and_the_lever_the_codebook():
    needs = {arm: fvr.arm_needs(arm) for arm in dict.fromkeys([*fair_verdict.TUNED_ARMS, *fair_verdict.COLD_ARMS])}
    assert needs == {"grpo:8": "verl", "reinforce_plus_plus:1": "verl", "bv_blend:2": "codebook",
                     "bv_blend:8": "codebook", "grpo_dynamic:8": "verl", "bv_blend_sampler_epoch:2": "codebook"}


def _cold(tmp_path: Path, finals: dict[str, list[float]]) -> fvr.Comparison:
    folder = tmp_path / "cold"
    for arm, by_seed in finals.items():
        for seed, final in enumerate(by_seed):
            _save(folder / fair_verdict.arm_folder(arm) / "lr_2e-05", arm, seed, 2e-5, {0: 0.02, 10: 0.1, 20: final})
    return fvr.cold_arms_comparison(folder)


GRPO_FINALS = [0.20, 0.22, 0.18, 0.21, 0.19]


@pytest.mark.parametrize(("rpp_gain", "pick", "resolved"), [
    (0.095, "reinforce_plus_plus:1", False),  # BV-Blend's lead over it holds zero: tied, and verl's is simpler
    (0.02, "bv_blend:2", True),  # BV-Blend resolved ahead of it: picked although it needs a codebook
], ids=["tied_the_simplest", "resolved_the_leader"])  # fmt: skip
def test_the_regime_pick_is_the_rules(tmp_path, rpp_gain, pick, resolved):
    noise = [0.010, -0.012, 0.008, -0.006, 0.0]
    cold = _cold(tmp_path, {
        "grpo:8": GRPO_FINALS,
        "bv_blend:2": [g + 0.10 + 0.002 * s for s, g in enumerate(GRPO_FINALS)],
        "reinforce_plus_plus:1": [g + rpp_gain + e for g, e in zip(GRPO_FINALS, noise, strict=True)],
    })
    found = fvr.regime_pick("cold", cold, ["grpo:8", "bv_blend:2", "reinforce_plus_plus:1"])
    assert found.recommendation.qualified[0] == "bv_blend:2"  # the largest difference leads
    assert found.recommendation.arm == pick and found.recommendation.resolved is resolved
    text = fvr.pick_text(found)
    assert text.startswith(f"**{fvr._label(pick)}**") and ("simplest" in text) is not resolved


def test_the_regime_pick_waits_for_every_arm_s_five_seeds_and_may_keep_grpo(tmp_path):
    short = _cold(tmp_path / "a", {"grpo:8": GRPO_FINALS, "bv_blend:2": [0.5] * 4})
    found = fvr.regime_pick("cold", short, ["grpo:8", "bv_blend:2"])
    assert found.recommendation is None and found.pending == "pending: bv_blend n=2 (32 prompts) has 4 of 5 seeds"
    behind = _cold(tmp_path / "b", {"grpo:8": GRPO_FINALS, "bv_blend:2": [g - 0.05 for g in GRPO_FINALS]})
    kept = fvr.regime_pick("cold", behind, ["grpo:8", "bv_blend:2"])
    assert kept.recommendation.arm is None and "it stays the pick" in fvr.pick_text(kept)


def test_the_report_says_which_regime_picks_are_pending(state, tmp_path):
    text = fvr.report_markdown(tmp_path / "out", state, STEPS)
    # at its own rate only GRPO has chosen (its committed runs count); BV-Blend n = 8, the first cut, is not awaited
    wide = _row(text, "| a prompt seen about")
    assert "| grpo n=8 (8 prompts), reinforce_plus_plus n=1 (64 prompts), bv_blend n=2 (32 prompts) | pending: " \
           "reinforce_plus_plus n=1 (64 prompts): no rate of its own yet: its tuning has not chosen; bv_blend n=2 " \
           "(32 prompts): no rate of its own yet: its tuning has not chosen |" in wide
    # in the cold start GRPO and BV-Blend n = 2 have their five seeds, the other four arms none
    cold = _row(text, "| a cold start")
    assert "pending: bv_blend n=8 (8 prompts): no run finished;" in cold and "grpo n=8 (8 prompts):" not in cold
