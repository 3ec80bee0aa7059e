"""scripts/compare_cpu.py's aggregation over seeds, pairing with a reference, the docs it writes and its command
line (arguments, the settings file, failed runs, --report), on results written as the comparison writes them
(no verl run). Its arms and bookkeeping: tests/demo/test_compare.py."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from instruments.compare import arms as compare_arms
from instruments.compare import pairing
from instruments.compare import report as compare_report
from instruments.compare import runs as compare_runs
from instruments.run.settings import RunSettings
from tests._scripts import load_script


# ------------------------------------------------------------------------------------------------- statistics
def test_mean_ci_is_a_t_interval_over_seeds():
    mean, half = compare_report.mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-6)
    assert compare_report.mean_ci([0.4])[0] == 0.4 and math.isnan(compare_report.mean_ci([0.4])[1])


def _result(arm, n, seed, after, before=0.3, curve=None, rollouts=32):
    arm_of = compare_arms.ARMS[arm]
    spec = compare_arms.RunSpec(arm, n, rollouts // n, seed, arm_of.estimator, arm_of.overrides)
    validation = curve or {0: before, 10: (before + after) / 2, 20: after}
    return {"spec": spec.describe(),
            "validation": {str(k): v for k, v in validation.items()},
            "signal": {"1": 0.5, "2": 0.6},
            "summary": {"val before": validation[0], "val after": validation[max(validation)],
                        "gain": validation[max(validation)] - validation[0], "signal ratio": 0.55,
                        "all-right %": 10.0, "all-wrong %": 30.0, "all-equal %": 40.0, "step time s": 3.0,
                        "adv share %": 2.0, "max |A|": 1.0 + seed, "adv time ms": 20.0, "between steps s": 0.1},
            "wall_s": 600.0}


def _grid_results():
    finals = {("grpo", 8): [0.50, 0.52, 0.54], ("spo", 1): [0.51, 0.53, 0.55],
              ("spo_sampler", 1): [0.60, 0.61, 0.65], ("bv_blend_prompt", 2): [0.40, 0.42, 0.44]}
    return [_result(arm, n, seed, v) for seed in range(3) for (arm, n), values in finals.items()
            for v in values[seed:seed + 1]]


def test_tables_average_over_seeds_and_pair_every_arm_with_the_reference_by_seed():
    results = _grid_results()
    table = compare_report.summary_table(results)
    assert list(table.index) == ["grpo n=8 (4 prompts)", "spo n=1 (32 prompts)", "spo_sampler n=1 (32 prompts)",
                                 "bv_blend_prompt n=2 (16 prompts)"]  # the command's order
    half = 4.302653 * 0.02 / math.sqrt(3)
    assert table.loc["grpo n=8 (4 prompts)", "val after"] == f"0.520 ± {half:.3f}"
    assert table.loc["grpo n=8 (4 prompts)", "max abs(A)"] == "3.00"  # the largest over seeds
    assert table.loc["grpo n=8 (4 prompts)", "run min"] == "10.0"
    diffs = compare_report.paired_differences(results, ("grpo", 8))
    ref_column = "minus grpo n=8 (4 prompts) (final)"
    assert diffs.loc["grpo n=8 (4 prompts)", "rollouts to reach, x ref"] == "1 (by definition)"
    # spo: +0.01 every seed (zero spread) -> resolved; spo_sampler: +0.10, +0.09, +0.11; bv_blend_prompt: -0.10
    assert diffs.loc["spo n=1 (32 prompts)", "95% CI"] == "spo ahead"
    assert diffs.loc["spo_sampler n=1 (32 prompts)", ref_column].startswith("+0.100 ± ")
    assert diffs.loc["bv_blend_prompt n=2 (16 prompts)", "95% CI"] == "grpo ahead"
    # another reference; an absent one falls back to the first arm
    assert compare_report.paired_differences(results, ("spo", 1)).loc["spo n=1 (32 prompts)", "95% CI"] == "-"
    assert "minus grpo n=8 (4 prompts) (final)" in compare_report.paired_differences(results, ("grpo", 2)).columns
    noisy = [_result("grpo", 8, 0, 0.5), _result("grpo", 8, 1, 0.6), _result("spo", 1, 0, 0.6),
             _result("spo", 1, 1, 0.5)]
    assert compare_report.paired_differences(noisy).loc["spo n=1 (32 prompts)", "95% CI"] == "no difference resolved"
    # only seeds both have are paired
    lonely = [_result("grpo", 8, 0, 0.5), _result("spo", 1, 0, 0.6), _result("spo", 1, 1, 0.9)]
    assert compare_report.paired_differences(lonely).loc["spo n=1 (32 prompts)", "seeds"] == "1"
    curve = compare_report.curves(results)
    assert set(curve["step"]) == {0, 10, 20} and (curve["seeds"] == 3).all()


def test_a_companion_run_without_a_signal_ratio_reads_it_from_its_all_equal_groups():
    """HA-DW and MaxNorm-AC give 0 exactly to the groups whose 0/1 scores all agree: where a result kept no signal
    ratio (the companions' runs read at 24cc6c9), it is the share of the other groups; REINFORCE++ at one rollout a
    prompt has none (every group is all-equal), and a logged one is never replaced."""
    results = [_result(arm, n, 0, 0.5) for arm, n in (("grpo", 8), ("ha_dw", 8), ("maxnorm_rloo", 8),
                                                       ("reinforce_plus_plus", 1))]
    for r in results[1:]:
        r["summary"]["signal ratio"] = float("nan")
    results[1]["summary"]["all-equal %"] = 46.25
    table = compare_report.summary_table(results)
    assert table.loc["grpo n=8 (4 prompts)", "signal ratio"] == "0.550"  # its own, not 1 - 40%
    assert table.loc["ha_dw n=8 (4 prompts)", "signal ratio"] == "0.537"  # 1 - 0.4625
    assert table.loc["maxnorm_rloo n=8 (4 prompts)", "signal ratio"] == "0.600"
    assert table.loc["reinforce_plus_plus n=1 (32 prompts)", "signal ratio"] == "n/a"


def test_rollouts_to_reach_the_reference_by_hand():
    """Seed-mean curves, linear between validations (steps 0, 10, 20 at 32 rollouts a step):
    reference 0.2, 0.4, 0.5 -> its final 0.5, reached at step 20 (640 rollouts).
    fast: 0.2, 0.6, 0.7 -> 0.5 at 0 + 10 (0.5 - 0.2) / (0.6 - 0.2) = 7.5 steps: 7.5 / 20 = 0.375x.
    slow: 0.2, 0.3, 0.45 never reaches 0.5. A reference that passes its final value before its end (0.2, 0.6, 0.5)
    reaches it at 7.5 steps; an arm at 0.2, 0.4, 0.6 reaches it at 15: 2x."""
    ref = [_result("grpo", 8, 0, 0, curve={0: 0.1, 10: 0.3, 20: 0.5}),
           _result("grpo", 8, 1, 0, curve={0: 0.3, 10: 0.5, 20: 0.5})]
    fast = [_result("spo", 1, 0, 0, curve={0: 0.1, 10: 0.5, 20: 0.6}),
            _result("spo", 1, 1, 0, curve={0: 0.3, 10: 0.7, 20: 0.8})]
    slow = [_result("spo_sampler", 1, s, 0, curve={0: 0.2, 10: 0.3, 20: 0.45}) for s in (0, 1)]
    def reach(arm: list[dict], reference: list[dict]) -> float:  # pairing's reading, which the report prints
        return pairing.pair(pairing.by_seed(arm), pairing.by_seed(reference)).reading().reach.value

    assert reach(fast, ref) == pytest.approx(0.375)
    assert math.isinf(reach(slow, ref))
    diffs = compare_report.paired_differences(ref + fast + slow)
    assert diffs.loc["spo n=1 (32 prompts)", "rollouts to reach, x ref"] == "0.38x"
    assert diffs.loc["spo_sampler n=1 (32 prompts)", "rollouts to reach, x ref"] == "> 1.00x (not reached)"
    # the bootstrap over the two seeds: seed 0 alone 0.5x (10 of 20 steps), seed 1 alone 0.5x (5 of 10), both 0.375x
    assert diffs.loc["spo n=1 (32 prompts)", "its 95% CI"] == "[0.38x, 0.50x]"
    assert diffs.loc["spo_sampler n=1 (32 prompts)", "its 95% CI"] == "[not reached, not reached]"
    early = [_result("grpo", 8, 0, 0, curve={0: 0.2, 10: 0.6, 20: 0.5})]
    arm = [_result("spo", 1, 0, 0, curve={0: 0.2, 10: 0.4, 20: 0.6})]
    assert reach(arm, early) == pytest.approx(2.0)
    flat = [_result("grpo", 8, 0, 0, curve={0: 0.5, 10: 0.4, 20: 0.5})]  # starts at its final value
    differences = compare_report.paired_differences(flat + arm)
    assert differences.loc["spo n=1 (32 prompts)", "rollouts to reach, x ref"] == "n/a"


def test_dynamic_sampling_is_paired_at_the_references_final_rollouts(tmp_path):
    """grpo_dynamic drops 4 groups of 8 (32 rollouts) a step in steps 1-10, so it has generated the reference's
    final 640 rollouts by its step 10: its row reads its curve there (0.45 and 0.5 against the reference's 0.5 and
    0.6: -0.075), not at its last step. Its seed-mean curve (0.2, 0.475, 0.75 at 0, 640, 960 rollouts) reaches the
    reference's final mean 0.55 at 640 + 320 x 0.075 / 0.275 rollouts: 1.14x."""
    ref = [_result("grpo", 8, 0, 0, curve={0: 0.2, 10: 0.4, 20: 0.5}),
           _result("grpo", 8, 1, 0, curve={0: 0.2, 10: 0.4, 20: 0.6})]
    dynamic = [_result("grpo_dynamic", 8, 0, 0, curve={0: 0.2, 10: 0.45, 20: 0.7}),
               _result("grpo_dynamic", 8, 1, 0, curve={0: 0.2, 10: 0.5, 20: 0.8})]
    for run in dynamic:
        run["filter_groups"] = {"evicted_samples": {str(step): 3.0 for step in range(1, 11)},
                                "discarded_surplus_samples": {str(step): 1.0 for step in range(1, 11)}}
    diffs = compare_report.paired_differences(ref + dynamic)
    row = diffs.loc["grpo_dynamic n=8 (4 prompts)"]
    assert row["minus grpo n=8 (4 prompts) (final)"].startswith("-0.075 ± ")  # at its last step it would be +0.2
    assert row["rollouts to reach, x ref"] == "1.14x"
    assert compare_report.curves(dynamic)["rollouts"].tolist() == [0.0, 640.0, 960.0]
    text = compare_report.results_markdown(ref + dynamic, "cmd", "CPU: test", "x.png", None, {}, "today")
    assert ("grpo_dynamic n=8 (4 prompts) generated 960 rollouts in its 20 steps (mean over seeds: its batch, plus 8 "
            "for each group verl's dynamic sampling dropped), so its row is read at the reference's final 640") in text
    assert compare_report.plot_comparison(ref + dynamic, tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------------------------------------------- docs
def test_docs_keep_hand_written_text_around_the_markers(tmp_path):
    results = _grid_results()
    png = compare_report.plot_comparison(results, tmp_path / "bench_cpu.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    generated = compare_report.results_markdown(results, "python scripts/compare_cpu.py", "CPU: test", png.name, 7200.0,
                                         {"steps": "100"}, "2026-12-01")
    assert "python scripts/compare_cpu.py" in generated and "CPU: test" in generated and "bench_cpu.png" in generated
    assert "- `spo_sampler`: `algorithm.adv_estimator=spo`, overrides `data.history_sampler.enable=true`" in generated
    assert "Every arm minus grpo n=8 (4 prompts)" in generated
    doc = tmp_path / "benchmarks.md"
    begin, end = compare_report.BEGIN, compare_report.END
    doc.write_text(f"# Title\n\nintro\n\n{begin}\nplaceholder\n{end}\n\n## Why (by hand)\n")
    compare_report.write_benchmarks(doc, generated)
    text = doc.read_text()
    assert text.startswith("# Title\n\nintro\n") and text.endswith("## Why (by hand)\n")
    assert "placeholder" not in text and "| grpo n=8 (4 prompts) |" in text
    compare_report.write_benchmarks(doc, generated)  # again: idempotent
    assert doc.read_text() == text
    doc.write_text("no markers")
    with pytest.raises(ValueError, match="has no .* markers"):
        compare_report.write_benchmarks(doc, generated)
    assert doc.read_text() == "no markers"


def test_the_report_names_every_machine_its_runs_ran_on():
    """A comparison resumed on another machine mixes CPUs; the header says so instead of naming the report's CPU."""
    old, a, b = ({"wall_s": 1.0}, {"wall_s": 1.0, "cpu": "CPU: A (AVX2 only; avx2)"},
                 {"wall_s": 1.0, "cpu": "CPU: B (AMX; avx2)"})
    assert compare_report.runs_machines([old, old], "CPU: here") == "CPU: here"  # before runs recorded it
    assert compare_report.runs_machines([a, a], "CPU: here") == "CPU: A (AVX2 only; avx2)"
    mixed = "CPU: A (AVX2 only; avx2) (1 runs); CPU: B (AMX; avx2) (2 runs)"
    assert compare_report.runs_machines([a, b, b], "CPU: here") == mixed
    unrecorded = "CPU: B (AMX; avx2) (1 runs); 1 runs without a recorded CPU"
    assert compare_report.runs_machines([old, b], "CPU: here") == unrecorded
    results = [{**r, "cpu": "AB"[i % 2]} for i, r in enumerate(_grid_results())]
    generated = compare_report.results_markdown(results, "cmd", "CPU: here", "x.png", None, {}, "2026-12-02")
    assert "CPU: here" not in generated and "`A (" in generated and "; B (" in generated


# ----------------------------------------------------------------------------------------------------- script


def test_script_checks_arguments_before_any_work(capsys):
    script = load_script("compare_cpu")
    a = script.parse_args([])
    assert len(a.specs) == 12 and a.steps >= 100 and len(a.seeds) >= 3  # the first comparison's grid
    assert a.reference == ("grpo", 4) and a.pool == 100 * 16  # no grpo:8: the first arm; each row once
    a = script.parse_args(["--arms", "grpo:8", "spo:1", "spo_sampler:1", "--train-prompts", "320"])
    assert a.reference == ("grpo", 8) and a.pool == 320 and [s.batch for s in a.specs[:3]] == [4, 32, 32]
    assert script.parse_args(["--arms", "grpo:8", "spo:1", "--reference", "spo:1"]).reference == ("spo", 1)
    for bad, message in [(["--arms", "grpo:3"], "divide --rollouts-per-step"), (["--arms", "grpo"], "not ARM:N"),
                         (["--arms", "grpo:8", "--reference", "spo:1"], "is not one of --arms"),
                         (["--arms", "spo:1", "--train-prompts", "8"], "smaller than the largest batch"),
                         (["--steps", "0"], "must be positive")]:
        with pytest.raises(SystemExit):
            script.parse_args(bad)
        assert message in capsys.readouterr().err


def _git(repo, *args):
    # an identity of its own: CI's clean machine has no git user, and a commit without one fails
    subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", *args], cwd=repo,
                   check=True, capture_output=True)


def test_script_takes_lr_and_steps_from_a_committed_settings_file_only(tmp_path, capsys, monkeypatch):
    script = load_script("compare_cpu")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # tmp_path is outside git wherever it lies
    settings = tmp_path / "pretrained_lm_settings.json"
    settings.write_text(json.dumps({"lr": 1e-5, "steps": 40, "rules": "selection.py"}))
    arms = ["--arms", "grpo:8", "--rollouts-per-step", "64"]

    def refused(args, message):
        with pytest.raises(SystemExit):
            script.parse_args([*arms, *args])
        assert message in capsys.readouterr().err

    refused(["--settings", str(settings)], "is not in a git checkout")
    _git(tmp_path, "init", "-q")
    refused(["--settings", str(settings)], "is not committed")
    _git(tmp_path, "add", settings.name)
    _git(tmp_path, "commit", "-qm", "settings")
    a = script.parse_args([*arms, "--settings", str(settings)])
    commit = subprocess.run(["git", "log", "-1", "--format=%h"], cwd=tmp_path, capture_output=True, text=True,
                            check=True).stdout.strip()
    assert (a.lr, a.steps, a.settings_commit, a.pool) == (1e-5, 40, commit, 40 * 8)
    refused(["--settings", str(settings), "--lr", "2e-5"], "drop --lr/--steps")
    refused(["--settings", str(settings), "--steps", "20"], "drop --lr/--steps")
    refused(["--settings", str(tmp_path / "absent.json")], "no such file")
    settings.write_text(json.dumps({"lr": 2e-5, "steps": 40}))
    refused(["--settings", str(settings)], f"differs from its commit {commit}")
    a = script.parse_args(arms)  # without the file: the flags' defaults, and no commit to name
    assert (a.lr, a.steps, a.settings_commit) == (RunSettings.lr, 100, None)


def test_script_refuses_an_out_folder_made_with_other_settings(tmp_path, monkeypatch):
    script = load_script("compare_cpu")
    out = tmp_path / "out"
    spec = compare_arms.grid([("grpo", 4)], 32, [0])[0]
    folder = compare_runs.fresh_run_dir(out, spec)
    (folder / compare_runs.RESULT_FILE).write_text(json.dumps({"settings": {"steps": "5"}, "spec": {}}))
    monkeypatch.setattr(script, "prepare", lambda *a, **k: pytest.fail("prepared before checking the out folder"))
    with pytest.raises(ValueError, match="was made with other settings"):
        script.main(["--out", str(out), "--arms", "grpo:4", "--seeds", "0"])


def test_script_runs_the_other_runs_when_one_fails_and_writes_no_results(tmp_path, monkeypatch, capsys):
    script = load_script("compare_cpu")
    ran = []

    def run_one(s, prepared, out, spec, key, on_step):
        ran.append(spec.name)
        if spec.arm == "grpo":
            raise RuntimeError("verl's trainer failed for grpo (exit 1)")
        compare_runs.fresh_run_dir(out, spec)
        compare_runs.save_result(out, spec, {"spec": {}, "settings": {}})

    monkeypatch.setattr(script, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(compare_runs, "run_one", run_one)
    (tmp_path / "out").mkdir()
    with pytest.raises(SystemExit, match=r"1 run\(s\) failed: grpo_n4_seed0.*run the same command again"):
        script.main(["--out", str(tmp_path / "out"), "--arms", "grpo:4", "spo:1", "--seeds", "0",
                     "--docs", str(tmp_path / "bench.md")])
    assert ran == ["grpo_n4_seed0", "spo_n1_seed0"] and not (tmp_path / "bench.md").exists()


def test_report_writes_the_finished_runs_marked_partial_and_runs_nothing(tmp_path, monkeypatch, capsys):
    script = load_script("compare_cpu")
    key = {"settings": "of this comparison"}
    monkeypatch.setattr(compare_runs, "settings_key", lambda s: key)
    monkeypatch.setattr(script, "prepare", lambda *a, **k: pytest.fail("--report prepared a run"))
    monkeypatch.setattr(compare_runs, "run_one", lambda *a, **k: pytest.fail("--report started a run"))
    out, doc = tmp_path / "out", tmp_path / "bench.md"
    doc.write_text(f"# Bench\n\n{compare_report.BEGIN}\nnot in yet\n{compare_report.END}\n")
    args = ["--out", str(out), "--arms", "grpo:8", "spo_sampler:1", "--train-prompts", "64", "--seeds", "0", "1",
            "--docs", str(doc), "--report"]
    with pytest.raises(SystemExit, match="no run .* has finished yet"):
        script.main(args)
    for spec in script.parse_args(args).specs[:3]:  # seed 0 of both arms, seed 1 of grpo
        compare_runs.fresh_run_dir(out, spec)
        record = _result(spec.arm, spec.n, spec.seed, 0.5 + 0.01 * spec.seed)
        record["summary"]["sampler/weight_entropy"] = 4.0
        compare_runs.save_result(out, spec, {**record, "settings": key})
    script.main(args)
    text = doc.read_text()
    assert "**Partial results: 3 of 4 runs.** Not run yet: spo_sampler_n1_seed1." in text
    assert "not in yet" not in text and "wall for this invocation" not in text
    command = next(line for line in text.splitlines() if line.startswith("python scripts/compare_cpu.py"))
    assert "--report" not in command and "| grpo n=8 (4 prompts) | 2 |" in text  # the command that completes it
    assert "train prompts=64" in text and "reference=grpo:8" in text
    assert "| spo_sampler n=1 (32 prompts) | 4.000 |" in text  # the sampler's table
    compare_runs.fresh_run_dir(out, script.parse_args(args).specs[3])  # every run finished: --report still ran none
    compare_runs.save_result(out, script.parse_args(args).specs[3],
                             {**_result("spo_sampler", 1, 1, 0.5), "settings": key})
    script.main(args)
    text = doc.read_text()
    assert "Partial results" not in text and "wall for this invocation" not in text
    monkeypatch.setattr(script, "prepare", lambda *a, **k: None)
    script.main([arg for arg in args if arg != "--report"])  # the command itself, once every run has finished
    text = doc.read_text()
    assert "Partial results" not in text and "wall for this invocation" not in text  # it ran no verl run either


def test_runs_stopped_at_their_budget_are_read_at_the_references_final_rollouts(tmp_path):
    """Two DAPO seeds stopped at a 640-rollout budget (4 groups of 8 dropped a step: 64 a step): seed 0 at step 10,
    seed 1 at step 12. The differences table reads each at the reference's final 640 rollouts, their step 10 (0.5 and
    0.7 against 0.5 and 0.6: +0.05), not at the reference's step 10, the last validation all share (320 rollouts: 0.4
    and 0.3 against 0.4 and 0.4: -0.05); the curves hold at each step only the seeds validated there, on their own
    rollouts."""
    ref = [_result("grpo", 8, 0, 0, curve={0: 0.2, 10: 0.4, 20: 0.5}),
           _result("grpo", 8, 1, 0, curve={0: 0.2, 10: 0.4, 20: 0.6})]
    dynamic = [_result("grpo_dynamic", 8, 0, 0, curve={0: 0.2, 5: 0.4, 10: 0.5}),
               _result("grpo_dynamic", 8, 1, 0, curve={0: 0.2, 5: 0.3, 10: 0.7, 12: 0.8})]
    for run, stop in zip(dynamic, (10, 12), strict=True):
        run["filter_groups"] = {"evicted_samples": {str(step): 4.0 for step in range(1, stop + 1)}}
        run["stopped"] = {"reason": "rollout budget", "step": stop, "rollouts": 64 * stop, "stop_at_rollouts": 640,
                          "steps": 20}
    row = compare_report.paired_differences(ref + dynamic).loc["grpo_dynamic n=8 (4 prompts)"]
    assert row["minus grpo n=8 (4 prompts) (final)"].startswith("+0.050 ± ")
    curve = compare_report.curves(dynamic).set_index("step")
    assert curve.loc[12, "seeds"] == 1 and curve.loc[12, "mean"] == pytest.approx(0.8)
    assert curve.loc[12, "rollouts"] == 768.0 and curve.loc[10, "rollouts"] == 640.0 and curve.loc[10, "seeds"] == 2
    text = compare_report.results_markdown(ref + dynamic, "cmd", "CPU: test", "x.png", None, {}, "today")
    assert ("grpo_dynamic n=8 (4 prompts) generated 704 rollouts by the step it stopped at, its rollout budget "
            "reached (mean step 11)") in text
