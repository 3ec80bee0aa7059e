"""scripts/compare_cpu.py's bookkeeping (resume), aggregation over seeds and docs writing, without verl runs: the
verl run is replaced by a folder written like verl writes it (tests/demo/_fake_run.py)."""

from __future__ import annotations

import importlib.util
import json
import math
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from bv_blend.demo import compare
from bv_blend.demo.pipeline import DemoSettings, Prepared
from tests.demo._fake_run import QUESTION_FAMILY, write_fake_run

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_cpu.py"


def test_grid_gives_every_group_size_the_same_rollout_budget_seeds_outermost():
    specs = compare.grid(["grpo", "bv_blend"], [4, 2], 32, [0, 1])
    assert [(s.method, s.n, s.batch, s.seed) for s in specs[:4]] == [
        ("grpo", 4, 8, 0), ("bv_blend", 4, 8, 0), ("grpo", 2, 16, 0), ("bv_blend", 2, 16, 0)]
    assert len(specs) == 8 and {s.n * s.batch for s in specs} == {32}
    assert len({s.name for s in specs}) == 8


@pytest.mark.parametrize(("sizes", "seeds", "match"), [
    ([3], [0], "group size 3 must be >= 2 and divide --rollouts-per-step 32"),
    ([1], [0], "group size 1 must be >= 2"),
    ([4, 4], [0], "must not repeat"),
    ([4], [1, 1], "must not repeat"),
])
def test_grid_refuses_bad_settings(sizes, seeds, match):
    with pytest.raises(ValueError, match=match):
        compare.grid(["grpo"], sizes, 32, seeds)


@pytest.fixture
def setup(tmp_path):
    s = DemoSettings(work_dir=tmp_path / "prepared", steps=4, test_freq=2)
    prepared = Prepared(model=Path("m"), train=Path("t"), val=Path("v"), codebook=Path("c"),
                        question_family=QUESTION_FAMILY)
    return s, prepared, tmp_path / "out", compare.settings_key(s)


def _fake_verl(calls: list, interrupt_for: str | None = None):
    def run_method(s, method, prepared, folder, **run):
        calls.append((method, run))
        write_fake_run_into(folder, method)
        if folder.name == interrupt_for:
            (folder / "metrics.jsonl").write_text("")  # a run cut short: its log is incomplete
            raise KeyboardInterrupt
        return folder

    return run_method


def write_fake_run_into(folder: Path, method: str) -> None:
    tmp = folder.with_name(folder.name + ".fake")
    write_fake_run(tmp, method)
    for item in tmp.iterdir():
        item.rename(folder / item.name)
    tmp.rmdir()


def test_resume_skips_finished_runs_and_restarts_an_interrupted_one(setup, monkeypatch):
    s, prepared, out, key = setup
    specs = compare.grid(["grpo", "bv_blend"], [4], 8, [0])
    calls: list = []
    monkeypatch.setattr(compare, "run_method", _fake_verl(calls, interrupt_for=specs[1].name))
    compare.run_one(s, prepared, out, specs[0], key)
    with pytest.raises(KeyboardInterrupt):
        compare.run_one(s, prepared, out, specs[1], key)
    # the interrupted run left files but no result: it is still pending, the finished one is not
    assert (compare.run_dir(out, specs[1]) / "metrics.jsonl").exists()
    assert compare.pending(out, specs, key) == [specs[1]]
    assert calls == [("grpo", {"n": 4, "batch": 2, "seed": 0}), ("bv_blend", {"n": 4, "batch": 2, "seed": 0})]
    # restart: only the pending run runs again, in an emptied folder
    (compare.run_dir(out, specs[1]) / "leftover.txt").write_text("from the interrupted attempt")
    monkeypatch.setattr(compare, "run_method", _fake_verl(calls))
    for spec in compare.pending(out, specs, key):
        compare.run_one(s, prepared, out, spec, key)
    assert compare.pending(out, specs, key) == []
    assert not (compare.run_dir(out, specs[1]) / "leftover.txt").exists()
    assert [c[0] for c in calls] == ["grpo", "bv_blend", "bv_blend"]
    result = compare.load_result(out, specs[1], key)
    assert result["spec"]["method"] == "bv_blend" and set(result["validation"]) == {"0", "2", "4"}
    assert result["summary"]["signal ratio"] == pytest.approx(0.875)


def test_progress_follows_the_last_step_verl_logged(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    seen: list[int] = []
    stop = threading.Event()
    follower = threading.Thread(target=compare.follow_steps, args=(metrics, seen.append, stop, 0.01))
    follower.start()
    try:
        time.sleep(0.05)  # no file yet: nothing reported
        metrics.write_text('{"step": 0, "data": {}}\n{"step": 1, "data": {}}\n{"step": 2, "data": {"a"')  # 2: half
        _wait_for(lambda: seen == [1])
        metrics.write_text('{"step": 0, "data": {}}\n{"step": 1, "data": {}}\n{"step": 2, "data": {"a": 1}}\n')
        _wait_for(lambda: seen == [1, 2])
    finally:
        stop.set()
        follower.join()


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_half_written_result_is_not_taken_for_finished(setup):
    s, prepared, out, key = setup
    spec = compare.grid(["grpo"], [4], 8, [0])[0]
    folder = compare.fresh_run_dir(out, spec)
    (folder / "result.tmp").write_text("{")
    assert compare.pending(out, [spec], key) == [spec]


def test_results_made_with_other_settings_are_refused(setup, monkeypatch):
    s, prepared, out, key = setup
    spec = compare.grid(["grpo"], [4], 8, [0])[0]
    monkeypatch.setattr(compare, "run_method", _fake_verl([]))
    compare.run_one(s, prepared, out, spec, key)
    other = compare.settings_key(DemoSettings(work_dir=s.work_dir, steps=8, test_freq=2))
    with pytest.raises(ValueError, match="was made with other settings.*Use another --out folder"):
        compare.pending(out, [spec], other)


def test_mean_ci_is_a_t_interval_over_seeds():
    mean, half = compare.mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-6)
    assert compare.mean_ci([0.4])[0] == 0.4 and math.isnan(compare.mean_ci([0.4])[1])


def _result(method, n, seed, after, before=0.3):
    return {"spec": {"method": method, "n": n, "batch": 32 // n, "seed": seed},
            "validation": {"0": before, "10": (before + after) / 2, "20": after},
            "signal": {"1": 0.5, "2": 0.6},
            "summary": {"val before": before, "val after": after, "gain": after - before, "signal ratio": 0.55,
                        "all-right %": 10.0, "all-wrong %": 30.0, "step time s": 3.0, "adv share %": 2.0},
            "wall_s": 600.0}


def _grid_results():
    finals = {("grpo", 4): [0.50, 0.52, 0.54], ("bv_blend", 4): [0.51, 0.53, 0.55],
              ("grpo", 2): [0.40, 0.42, 0.44], ("bv_blend", 2): [0.60, 0.61, 0.65]}
    return [_result(m, n, seed, v) for (m, n), values in finals.items() for seed, v in enumerate(values)]


def test_tables_average_over_seeds_and_pair_by_seed():
    results = _grid_results()
    table = compare.summary_table(results)
    assert list(table.index) == ["bv_blend n=2 (16 prompts)", "grpo n=2 (16 prompts)",
                                 "bv_blend n=4 (8 prompts)", "grpo n=4 (8 prompts)"]
    half = 4.302653 * 0.02 / math.sqrt(3)
    assert table.loc["grpo n=4 (8 prompts)", "val after"] == f"0.520 ± {half:.3f}"
    diffs = compare.paired_differences(results)
    # n=4: +0.01 every seed (zero spread) -> resolved; n=2: +0.20, +0.19, +0.21
    assert diffs.loc["n=4", "95% CI"] == "bv_blend ahead"
    assert diffs.loc["n=2", "bv_blend - grpo (final)"].startswith("+0.200 ± ")
    noisy = [_result("grpo", 4, 0, 0.5), _result("grpo", 4, 1, 0.6), _result("bv_blend", 4, 0, 0.6),
             _result("bv_blend", 4, 1, 0.5)]
    assert compare.paired_differences(noisy).loc["n=4", "95% CI"] == "no difference resolved"
    curve = compare.curves(results)
    assert set(curve["step"]) == {0, 10, 20} and (curve["seeds"] == 3).all()


def test_docs_keep_hand_written_text_around_the_markers(tmp_path):
    results = _grid_results()
    png = compare.plot_comparison(results, tmp_path / "bench_cpu.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    generated = compare.results_markdown(results, "python scripts/compare_cpu.py", "CPU: test", png.name, 7200.0,
                                         {"steps": "100"}, "2026-12-01")
    assert "python scripts/compare_cpu.py" in generated and "CPU: test" in generated and "bench_cpu.png" in generated
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Title\n\nintro\n\n{compare.BEGIN}\nplaceholder\n{compare.END}\n\n## Why (by hand)\n")
    compare.write_benchmarks(doc, generated)
    text = doc.read_text()
    assert text.startswith("# Title\n\nintro\n") and text.endswith("## Why (by hand)\n")
    assert "placeholder" not in text and "| grpo n=4 (8 prompts) |" in text
    compare.write_benchmarks(doc, generated)  # again: idempotent
    assert doc.read_text() == text
    doc.write_text("no markers")
    with pytest.raises(ValueError, match="has no .* markers"):
        compare.write_benchmarks(doc, generated)
    assert doc.read_text() == "no markers"


def _script():
    spec = importlib.util.spec_from_file_location("compare_cpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_checks_arguments_before_any_work(capsys):
    script = _script()
    a = script.parse_args([])
    assert len(a.specs) == 12 and a.steps >= 100 and len(a.seeds) >= 3  # the minimum comparison
    with pytest.raises(SystemExit):
        script.parse_args(["--group-sizes", "3"])
    assert "divide --rollouts-per-step" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.parse_args(["--steps", "0"])


def test_script_refuses_an_out_folder_made_with_other_settings(tmp_path, monkeypatch):
    script = _script()
    out = tmp_path / "out"
    spec = compare.grid(["grpo"], [4], 32, [0])[0]
    folder = compare.fresh_run_dir(out, spec)
    (folder / compare.RESULT_FILE).write_text(json.dumps({"settings": {"steps": "5"}, "spec": {}}))
    monkeypatch.setattr(script, "prepare", lambda *a, **k: pytest.fail("prepared before checking the out folder"))
    with pytest.raises(ValueError, match="was made with other settings"):
        script.main(["--out", str(out), "--methods", "grpo", "--group-sizes", "4", "--seeds", "0"])


def test_script_runs_the_other_runs_when_one_fails_and_writes_no_results(tmp_path, monkeypatch, capsys):
    script = _script()
    ran = []

    def run_one(s, prepared, out, spec, key, on_step):
        ran.append(spec.name)
        if spec.method == "grpo":
            raise RuntimeError("verl's trainer failed for grpo (exit 1)")
        compare.fresh_run_dir(out, spec)
        compare.save_result(out, spec, {"spec": {}, "settings": {}})

    monkeypatch.setattr(script, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(compare, "run_one", run_one)
    (tmp_path / "out").mkdir()
    with pytest.raises(SystemExit, match=r"1 run\(s\) failed: grpo_n4_seed0.*run the same command again"):
        script.main(["--out", str(tmp_path / "out"), "--group-sizes", "4", "--seeds", "0",
                     "--docs", str(tmp_path / "bench.md")])
    assert ran == ["grpo_n4_seed0", "bv_blend_n4_seed0"] and not (tmp_path / "bench.md").exists()


def test_report_writes_the_finished_runs_marked_partial_and_runs_nothing(tmp_path, monkeypatch, capsys):
    script = _script()
    key = {"settings": "of this comparison"}
    monkeypatch.setattr(compare, "settings_key", lambda s: key)
    monkeypatch.setattr(script, "prepare", lambda *a, **k: pytest.fail("--report prepared a run"))
    monkeypatch.setattr(compare, "run_one", lambda *a, **k: pytest.fail("--report started a run"))
    out, doc = tmp_path / "out", tmp_path / "bench.md"
    doc.write_text(f"# Bench\n\n{compare.BEGIN}\nnot in yet\n{compare.END}\n")
    args = ["--out", str(out), "--group-sizes", "4", "--seeds", "0", "1", "--docs", str(doc), "--report"]
    with pytest.raises(SystemExit, match="no run .* has finished yet"):
        script.main(args)
    for spec in script.parse_args(args).specs[:3]:  # seed 0 of both methods, seed 1 of grpo
        compare.fresh_run_dir(out, spec)
        record = _result(spec.method, spec.n, spec.seed, 0.5 + 0.01 * spec.seed)
        compare.save_result(out, spec, {**record, "spec": asdict(spec), "settings": key})
    script.main(args)
    text = doc.read_text()
    assert "**Partial results: 3 of 4 runs.** Not run yet: bv_blend_n4_seed1." in text
    assert "not in yet" not in text and "wall for this invocation" not in text
    command = next(line for line in text.splitlines() if line.startswith("python scripts/compare_cpu.py"))
    assert "--report" not in command and "| grpo n=4 (8 prompts) | 2 |" in text  # the command that completes it
