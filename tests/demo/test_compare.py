"""scripts/compare_cpu.py's arms, bookkeeping (resume), aggregation over seeds, pairing with a reference and docs
writing, without verl runs: the verl run is replaced by a folder written like verl writes it
(tests/demo/_fake_run.py). The arms' overrides are composed with verl's real config."""

from __future__ import annotations

import json
import math
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from instruments.cpu.launch import DEFAULT_CPU_CONFIG
from instruments.demo import compare, compare_report, pairing, report, run_logs
from instruments.demo.pipeline import DemoSettings, Prepared
from instruments.demo.verl_run import MEMORY_FILE, verl_overrides
from tests._scripts import load_script
from tests.demo._fake_run import QUESTION_FAMILY, write_fake_run


# ------------------------------------------------------------------------------------------------------- arms
def test_grid_gives_every_arm_the_same_rollout_budget_seeds_outermost():
    specs = compare.grid([("grpo", 8), ("spo", 1), ("spo_sampler", 1), ("bv_blend_prompt", 2)], 32, [0, 1])
    assert [(s.arm, s.n, s.batch, s.seed, s.estimator) for s in specs[:4]] == [
        ("grpo", 8, 4, 0, "grpo"), ("spo", 1, 32, 0, "spo"), ("spo_sampler", 1, 32, 0, "spo"),
        ("bv_blend_prompt", 2, 16, 0, "bv_blend")]
    assert [s.seed for s in specs] == [0] * 4 + [1] * 4
    assert len(specs) == 8 and {s.n * s.batch for s in specs} == {32}
    assert len({s.name for s in specs}) == 8 and specs[2].name == "spo_sampler_n1_seed0"
    assert specs[2].samples_by_history and not specs[1].samples_by_history
    assert specs[2].overrides == compare.SAMPLER and specs[3].overrides == compare.PROMPT_LEVEL
    # the same arm at two group sizes is two arms
    assert [s.name for s in compare.grid([("grpo", 4), ("grpo", 2)], 8, [0])] == ["grpo_n4_seed0", "grpo_n2_seed0"]


@pytest.mark.parametrize(("arms", "seeds", "match"), [
    ([("grpo", 3)], [0], "group size 3 of grpo must be >= 1 and divide --rollouts-per-step 32"),
    ([("spo", 0)], [0], "group size 0 of spo must be >= 1"),
    ([("nope", 4)], [0], "unknown arm 'nope'; the arms are grpo, bv_blend"),
    ([("grpo", 4), ("grpo", 4)], [0], "must not repeat"),
    ([("grpo", 4)], [1, 1], "must not repeat"),
])
def test_grid_refuses_bad_settings(arms, seeds, match):
    with pytest.raises(ValueError, match=match):
        compare.grid(arms, 32, seeds)


def test_arms_are_parsed_as_arm_colon_group_size():
    assert compare.parse_arm("spo_sampler:1") == ("spo_sampler", 1)
    for text, match in [("grpo", "not ARM:N"), ("grpo:x", "not ARM:N"), ("gpro:8", "unknown arm 'gpro'")]:
        with pytest.raises(ValueError, match=match):
            compare.parse_arm(text)


def test_the_pool_is_steps_times_the_largest_batch_unless_given():
    specs = compare.grid([("grpo", 8), ("spo", 1)], 32, [0])
    assert compare.pool_size(specs, 60, None) == 60 * 32  # the old behaviour: every row seen once
    assert compare.pool_size(specs, 60, 320) == 320
    with pytest.raises(ValueError, match="smaller than the largest batch"):
        compare.pool_size(specs, 60, 16)


def _compose(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose(DEFAULT_CPU_CONFIG, overrides=overrides)  # what the launcher runs, by name


def _prepared(tmp_path: Path) -> Prepared:
    return Prepared(model=tmp_path / "model", train=tmp_path / "train.parquet", val=tmp_path / "val.parquet",
                    codebook=tmp_path / "codebook.npz")


@pytest.mark.parametrize("arm", list(compare.ARMS))
def test_every_arm_composes_with_verl_config_and_a_small_pool_gets_the_epochs_it_needs(tmp_path, arm):
    """Every key an arm overrides exists in verl's config (hydra refuses unknown keys), and a pool of 320 rows runs
    60 steps: verl stops after trainer.total_epochs passes, whatever total_training_steps says."""
    spec = compare.grid([(arm, 1)], 32, [3])[0]
    s = DemoSettings(work_dir=tmp_path, steps=60, n_train=320)
    priors = tmp_path / "priors.json"
    config = _compose(verl_overrides(s, spec.estimator, _prepared(tmp_path), tmp_path / "run", n=spec.n,
                                     batch=spec.batch, seed=spec.seed, extra=compare.run_overrides(spec, priors)))
    assert config.algorithm.adv_estimator == compare.ARMS[arm].estimator
    # an arm with priors reads the preparation's file, under the option of its estimator; no other arm reads one
    reads = {"spo": config.algorithm.get("spo", {}).get("offline_values"),
             "bv_blend": config.algorithm.bv_blend.prior_file}
    assert reads == {e: str(priors) if compare.ARMS[arm].reads_priors and e == spec.estimator else None
                     for e in reads}
    assert (config.actor_rollout_ref.rollout.n, config.data.train_batch_size) == (1, 32)
    assert config.data.history_sampler.enable is compare.ARMS[arm].samples_by_history
    if compare.ARMS[arm].samples_by_history:  # what bv_blend/verl/sampler.py requires
        assert config.data.shuffle is True and config.data.dataloader_num_workers == 0
    level = "prompt_and_cluster" if "prompt" in arm else "cluster"
    assert config.algorithm.bv_blend.history_level == level
    # 320 // 32 = 10 batches an epoch: 6 epochs for 60 steps
    assert (config.trainer.total_epochs, config.trainer.total_training_steps) == (6, 60)


def test_the_epochs_follow_the_pool_and_an_arm_cannot_override_the_demos_keys(tmp_path):
    s = DemoSettings(work_dir=tmp_path, steps=60, n_train=320)
    overrides = verl_overrides(s, "grpo", _prepared(tmp_path), tmp_path / "run", n=8, batch=4)
    assert "trainer.total_epochs=1" in overrides  # 80 batches of 4 an epoch
    default = DemoSettings(work_dir=tmp_path, steps=60)  # the demo: steps x batch rows, one epoch as before
    assert "trainer.total_epochs=1" in verl_overrides(default, "grpo", _prepared(tmp_path), tmp_path / "run")
    # 320 // 48 = 6 whole batches an epoch (verl drops the rest): 10 epochs
    assert "trainer.total_epochs=10" in verl_overrides(s, "grpo", _prepared(tmp_path), tmp_path / "run", batch=48)
    with pytest.raises(ValueError, match="set keys the demo sets"):
        verl_overrides(s, "grpo", _prepared(tmp_path), tmp_path / "run", extra=["++actor_rollout_ref.rollout.n=2"])
    with pytest.raises(ValueError, match="cannot fill a batch"):
        verl_overrides(s, "grpo", _prepared(tmp_path), tmp_path / "run", batch=400)


# ---------------------------------------------------------------------------------------------- bookkeeping
@pytest.fixture
def setup(tmp_path):
    s = DemoSettings(work_dir=tmp_path / "prepared", steps=4, test_freq=2)
    prepared = Prepared(model=Path("m"), train=Path("t"), val=Path("v"), codebook=Path("c"),
                        question_family=QUESTION_FAMILY)
    return s, prepared, tmp_path / "out", compare.settings_key(s)


def _fake_verl(calls: list, interrupt_for: str | None = None, **fake):
    def run_method(s, method, prepared, folder, **run):
        calls.append((method, run))
        write_fake_run_into(folder, method, **fake)
        if folder.name == interrupt_for:
            (folder / "metrics.jsonl").write_text("")  # a run cut short: its log is incomplete
            raise KeyboardInterrupt
        return folder

    return run_method


def write_fake_run_into(folder: Path, method: str, **fake) -> None:
    tmp = folder.with_name(folder.name + ".fake")
    write_fake_run(tmp, method, **fake)
    for item in tmp.iterdir():
        item.rename(folder / item.name)
    tmp.rmdir()


def test_resume_skips_finished_runs_and_restarts_an_interrupted_one(setup, monkeypatch):
    s, prepared, out, key = setup
    specs = compare.grid([("grpo", 4), ("bv_blend_prompt", 4)], 8, [0])
    calls: list = []
    monkeypatch.setattr(compare, "run_method", _fake_verl(calls, interrupt_for=specs[1].name))
    compare.run_one(s, prepared, out, specs[0], key)
    with pytest.raises(KeyboardInterrupt):
        compare.run_one(s, prepared, out, specs[1], key)
    # the interrupted run left files but no result: it is still pending, the finished one is not
    assert (compare.run_dir(out, specs[1]) / "metrics.jsonl").exists()
    assert compare.pending(out, specs, key) == [specs[1]]
    fresh = {"own_start": True, "empty_first": False, "checkpoint_every": s.test_freq, "resume_from": None}
    assert calls == [("grpo", {"n": 4, "batch": 2, "seed": 0, "extra": (), **fresh}),
                     ("bv_blend", {"n": 4, "batch": 2, "seed": 0, "extra": compare.PROMPT_LEVEL, **fresh})]
    # restart: only the pending run runs again, in an emptied folder (it left no checkpoint to resume from)
    (compare.run_dir(out, specs[1]) / "leftover.txt").write_text("from the interrupted attempt")
    monkeypatch.setattr(compare, "run_method", _fake_verl(calls))
    for spec in compare.pending(out, specs, key):
        compare.run_one(s, prepared, out, spec, key)
    assert compare.pending(out, specs, key) == []
    assert not (compare.run_dir(out, specs[1]) / "leftover.txt").exists()
    assert [c[0] for c in calls] == ["grpo", "bv_blend", "bv_blend"]
    result = compare.load_result(out, specs[1], key)
    assert result["spec"]["arm"] == "bv_blend_prompt" and set(result["validation"]) == {"0", "2", "4"}
    assert result["summary"]["signal ratio"] == pytest.approx(0.875)


def _copy_steps(source: Path, folder: Path, steps: range, metrics: str = "metrics.jsonl") -> None:
    """verl's files of ``steps`` from a whole fake run: as an attempt that logged only those would have left them."""
    lines = [line for line in (source / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["step"] in steps]
    (folder / metrics).write_text("".join(line + "\n" for line in lines))
    for dump in ("rollouts", "validation"):
        (folder / dump).mkdir(exist_ok=True)
        for path in (source / dump).glob("*.jsonl"):
            if int(path.stem) in steps:
                (folder / dump / path.name).write_text(path.read_text())


def test_an_interrupted_run_resumes_from_its_latest_logged_checkpoint_and_reads_as_one_run(setup, monkeypatch):
    """The first attempt saved checkpoints at steps 2 and 4 and died in step 4, after verl's save and before its
    log (verl saves inside the step): the run resumes from step 2, the later checkpoint and step 3's files go, and the
    result reads the two attempts as one run, the same as a run never interrupted."""
    s, prepared, out, key = setup
    spec = compare.grid([("bv_blend", 4)], 8, [0])[0]
    whole = write_fake_run(out.parent / "whole", "bv_blend")
    calls: list = []

    def first_attempt(s, method, prepared, folder, **run):
        calls.append(run)
        _copy_steps(whole, folder, range(0, 4))
        for step in (2, 4):
            (folder / "checkpoints" / f"global_step_{step}").mkdir(parents=True)
        (folder / "verl.log").write_text("attempt 1\n")
        raise KeyboardInterrupt

    def second_attempt(s, method, prepared, folder, **run):
        calls.append(run)
        assert not (folder / "rollouts" / "3.jsonl").exists(), "step 3 of the dead attempt was left"
        assert compare.resume.checkpoint_steps(folder) == [2]
        _copy_steps(whole, folder, range(3, 5))
        (folder / "checkpoints" / "global_step_4").mkdir()
        return folder

    monkeypatch.setattr(compare, "run_method", first_attempt)
    with pytest.raises(KeyboardInterrupt):
        compare.run_one(s, prepared, out, spec, key)
    folder = compare.run_dir(out, spec)
    assert compare.resume.resume_step(folder) == 2
    monkeypatch.setattr(compare, "run_method", second_attempt)
    result = compare.run_one(s, prepared, out, spec, key)
    assert [(c["own_start"], c["resume_from"]) for c in calls] == [
        (True, None), (False, folder / "checkpoints" / "global_step_2")]
    assert result["resumed_from_steps"] == [2] and result["attempt_cpus"] == [result["cpu"]] * 2
    assert (folder / "metrics.part1.jsonl").is_file() and (folder / "verl.part1.log").read_text() == "attempt 1\n"
    assert not (folder / "checkpoints").exists(), "a finished run keeps its ~1.6 GB checkpoints"
    assert len(compare.resume.read_attempts(folder)) == 2

    monkeypatch.setattr(compare, "run_method", _fake_verl([]))
    uninterrupted = compare.run_one(s, prepared, out.parent / "out2", spec, key)
    same = ("validation", "families_after", "signal", "visits")
    assert {k: result[k] for k in same} == {k: uninterrupted[k] for k in same}
    timeless = {k: v for k, v in result["summary"].items() if "time" not in k and "steps s" not in k}
    other = {k: v for k, v in uninterrupted["summary"].items() if k in timeless}
    assert json.dumps(timeless, sort_keys=True) == json.dumps(other, sort_keys=True)  # NaN is NaN here


def test_a_result_keeps_the_most_memory_its_attempts_held_which_the_next_run_needs(setup, monkeypatch):
    """Each attempt's memory.json (instruments/demo/verl_run.py writes it after verl exits) goes into its record; the
    result keeps the largest; an attempt that measured nothing does not inherit an earlier attempt's file."""
    s, prepared, out, key = setup
    specs = compare.grid([("grpo", 4), ("bv_blend", 4)], 8, [0])
    assert compare.memory_needed(out, specs, key) is None

    whole = write_fake_run(out.parent / "whole", "bv_blend")

    def holding(gib: float | None, steps: range | None = None, interrupt: bool = False):
        def run_method(s, method, prepared, folder, **run):
            if steps is None:
                write_fake_run_into(folder, method)
            else:
                _copy_steps(whole, folder, steps)
            if gib is not None:
                (folder / MEMORY_FILE).write_text(json.dumps({"peak_memory_gib": gib, "least_available_gib": 3.0}))
            if interrupt:  # died in step 4, after step 2's checkpoint, with its memory recorded
                (folder / "checkpoints" / "global_step_2").mkdir(parents=True)
                raise KeyboardInterrupt
            return folder
        return run_method

    monkeypatch.setattr(compare, "run_method", holding(7.5))
    assert compare.run_one(s, prepared, out, specs[0], key)["peak_memory_gib"] == 7.5
    assert compare.memory_needed(out, specs, key) == (7.5, specs[0].name)
    monkeypatch.setattr(compare, "run_method", holding(9.0, range(0, 4), interrupt=True))
    with pytest.raises(KeyboardInterrupt):
        compare.run_one(s, prepared, out, specs[1], key)
    monkeypatch.setattr(compare, "run_method", holding(None, range(3, 5)))  # the resumed attempt measured nothing
    result = compare.run_one(s, prepared, out, specs[1], key)
    attempts = compare.resume.read_attempts(compare.run_dir(out, specs[1]))
    assert "peak_memory_gib" not in attempts[-1] and result["resumed_from_steps"] == [2]
    assert "peak_memory_gib" not in result  # the first attempt died before its record was closed
    assert compare.memory_needed(out, specs, key) == (7.5, specs[0].name)


def test_the_script_starts_no_run_the_machine_cannot_hold(tmp_path, monkeypatch):
    """A finished run held more than is available now (here: far more than any machine has): the next run is
    refused before verl starts, naming the need, unless --no-memory-check."""
    script = load_script("compare_cpu")
    out = tmp_path / "out"
    first, second = compare.grid([("grpo", 4), ("spo", 1)], 32, [0])
    argv = ["--out", str(out), "--arms", "grpo:4", "spo:1", "--seeds", "0", "--docs", str(tmp_path / "bench.md")]
    key = compare.settings_key(script.demo_settings(script.parse_args(argv)))
    compare.fresh_run_dir(out, first)
    compare.save_result(out, first, {"spec": first.describe(), "settings": key, "peak_memory_gib": 1e6})
    ran = []
    monkeypatch.setattr(script, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(compare, "run_one", lambda s, prepared, out, spec, key, on_step: ran.append(spec.name))
    monkeypatch.setattr(script, "write_report", lambda *a, **k: None)
    with pytest.raises(SystemExit, match=r"held 1000000\.0 GiB \(the most of this comparison's finished runs, "
                                         r"grpo_n4_seed0\).*--no-memory-check starts the run anyway"):
        script.main(argv)
    assert ran == []
    script.main([*argv, "--no-memory-check"])
    assert ran == [second.name]


def test_a_run_verl_finished_whose_reading_failed_is_read_again_not_resumed(setup, monkeypatch):
    """verl exited 0 and the reader raised (a model's U+2028 in a dump, before bv_blend.core.jsonl): the rerun reads
    the folder as it is. Resuming from its last checkpoint would have trained a step past the run's end."""
    s, prepared, out, key = setup
    spec = compare.grid([("grpo", 4)], 8, [0])[0]

    def finished_with_checkpoints(s, method, prepared, folder, **run):
        write_fake_run_into(folder, method)
        for step in (2, 4):
            (folder / "checkpoints" / f"global_step_{step}").mkdir(parents=True)
        return folder

    def broken_reader(*args, **kwargs):
        raise ValueError("a reader's bug")

    monkeypatch.setattr(compare, "run_method", finished_with_checkpoints)
    monkeypatch.setattr(compare.report, "read_run", broken_reader)
    with pytest.raises(ValueError, match="a reader's bug"):
        compare.run_one(s, prepared, out, spec, key)
    folder = compare.run_dir(out, spec)
    assert compare.resume.completed(folder, s.steps) and not compare.resume.completed(folder, s.steps + 1)
    verl_end = compare.verl_ended_utc(compare.resume.read_attempts(folder))

    monkeypatch.undo()
    monkeypatch.setattr(compare, "run_method", lambda *a, **k: pytest.fail("verl ran again"))
    seen: list[int] = []
    result = compare.run_one(s, prepared, out, spec, key, on_step=seen.append)
    assert set(result["validation"]) == {"0", "2", "4"} and "resumed_from_steps" not in result
    assert result["ended_utc"] == verl_end and seen == [s.steps]
    assert len(compare.resume.read_attempts(folder)) == 1 and not (folder / "checkpoints").exists()


def test_an_open_attempt_is_not_taken_for_a_finished_run(tmp_path):
    from instruments.demo import resume

    write_fake_run(tmp_path / "r")
    resume.start_attempt(tmp_path / "r", None)  # verl died after logging its last step, before the attempt closed
    assert not resume.completed(tmp_path / "r", 4)
    resume.finish_attempt(tmp_path / "r")
    assert resume.completed(tmp_path / "r", 4) and not resume.completed(tmp_path / "missing", 4)


def test_resume_step_needs_a_checkpoint_whose_step_was_logged(tmp_path):
    from instruments.demo import resume

    assert resume.resume_step(tmp_path) is None  # nothing yet
    (tmp_path / "checkpoints" / "global_step_4").mkdir(parents=True)
    (tmp_path / "metrics.jsonl").write_text('{"step": 2, "data": {}}\n{"step": 3, "data": {}}\n{"step": 4, "da')
    assert resume.resume_step(tmp_path) is None  # step 4 half-written: not logged, and no earlier checkpoint
    (tmp_path / "checkpoints" / "global_step_2").mkdir()
    assert resume.resume_step(tmp_path) == 2


def test_a_changed_arm_definition_refuses_its_old_results(setup, monkeypatch):
    s, prepared, out, key = setup
    spec = compare.grid([("spo", 1)], 8, [0])[0]
    monkeypatch.setattr(compare, "run_method", _fake_verl([]))
    compare.run_one(s, prepared, out, spec, key)
    assert compare.pending(out, [spec], key) == []
    changed = compare.RunSpec(spec.arm, spec.n, spec.batch, spec.seed, spec.estimator, ("algorithm.spo.x=1",))
    with pytest.raises(ValueError, match="was made with other settings"):
        compare.pending(out, [changed], key)


# rollouts at n=1: every group is all-equal; with dump times that give known gaps between steps
N1_ROLLOUTS = {step: [(f"Add {step} and {i}.", [int(i < 3)]) for i in range(4)] for step in (1, 2, 3, 4)}
DUMP_TIMES = {1: 100.0, 2: 140.0, 3: 150.0, 4: 161.0}
SAMPLER_METRICS = {step: {"sampler/weight_entropy": 5.0 + step, "sampler/p_hat_mean_drawn": 0.1 * step,
                          "sampler/zero_variance_expected": 1.0, "sampler/weight_age_steps": 0.0,
                          "spo/p_hat_mean": 0.5, "critic/advantages/max": 1.5 * step,
                          "critic/advantages/min": -7.0 if step == 3 else -1.0,
                          **({"timing_s/testing": 3.0} if step == 3 else {})} for step in (1, 2, 3, 4)}


def test_an_n1_sampler_run_reports_all_equal_groups_max_abs_a_sampler_means_and_the_time_between_steps(
        setup, monkeypatch):
    s, prepared, out, key = setup
    spec = compare.grid([("spo_sampler", 1)], 4, [0])[0]

    def fake(s, method, prepared, folder, **run):
        write_fake_run_into(folder, method, rollouts=N1_ROLLOUTS, extra_metrics=SAMPLER_METRICS)
        for step, t in DUMP_TIMES.items():
            os.utime(folder / "rollouts" / f"{step}.jsonl", (t, t))
        return folder

    monkeypatch.setattr(compare, "run_method", fake)
    summary = compare.run_one(s, prepared, out, spec, key)["summary"]
    assert (summary["all-right %"], summary["all-wrong %"], summary["all-equal %"]) == (75.0, 25.0, 100.0)
    assert math.isnan(summary["signal ratio"])  # not defined for SPO
    assert summary["max |A|"] == 7.0  # |min| of step 3
    assert summary["sampler/weight_entropy"] == pytest.approx(7.5) and summary["spo/p_hat_mean"] == 0.5
    assert summary["sampler/p_hat_mean_drawn"] == pytest.approx(0.25)
    # steps 1-4 take 30, 4, 5, 6 s (_fake_run.STEP_TIME); verl's V1 trainer dumps a step's rollouts after its
    # validation: gap 2->3: 10 - 5 - 3 (step 3's validation) = 2; gap 3->4: 11 - 6 = 5; the gap after step 1 is left out
    assert summary["between steps s"] == pytest.approx(3.5)
    assert summary["adv time ms"] == pytest.approx(200.0)  # steps 2-4: 0.2, 0.1, 0.3 s
    # a run resumed from step 2: the gap 2->3 spans the interruption and a start-up, and is left out
    metrics = report.read_run_metrics(compare.run_dir(out, spec))
    rollouts = compare.run_dir(out, spec) / "rollouts"
    assert run_logs.between_steps_s(metrics, rollouts, resumed_from=[2]) == pytest.approx(5.0)
    table = compare_report.summary_table([compare.load_result(out, spec, key)])
    row = table.loc["spo_sampler n=1 (4 prompts)"]
    assert row["all-equal % (right + wrong)"] == "100.0 (75.0 + 25.0)" and row["signal ratio"] == "n/a"
    assert row["max abs(A)"] == "7.00" and row["between steps s"] == "3.500"
    sampler = compare_report.sampler_table([compare.load_result(out, spec, key)])
    assert sampler.loc["spo_sampler n=1 (4 prompts)", "sampler/weight_entropy"] == "7.500"


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
    spec = compare.grid([("grpo", 4)], 8, [0])[0]
    folder = compare.fresh_run_dir(out, spec)
    (folder / "result.tmp").write_text("{")
    assert compare.pending(out, [spec], key) == [spec]


def test_results_made_with_other_settings_are_refused(setup, monkeypatch):
    s, prepared, out, key = setup
    spec = compare.grid([("grpo", 4)], 8, [0])[0]
    monkeypatch.setattr(compare, "run_method", _fake_verl([]))
    compare.run_one(s, prepared, out, spec, key)
    other = compare.settings_key(DemoSettings(work_dir=s.work_dir, steps=8, test_freq=2))
    with pytest.raises(ValueError, match="was made with other settings.*Use another --out folder"):
        compare.pending(out, [spec], other)
    # another pool is another setting
    bigger = compare.settings_key(DemoSettings(work_dir=s.work_dir, steps=4, test_freq=2, n_train=320))
    assert bigger != key and bigger["n_train"] == "320"


# ------------------------------------------------------------------------------------------------- statistics
def test_mean_ci_is_a_t_interval_over_seeds():
    mean, half = compare_report.mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-6)
    assert compare_report.mean_ci([0.4])[0] == 0.4 and math.isnan(compare_report.mean_ci([0.4])[1])


def _result(arm, n, seed, after, before=0.3, curve=None, rollouts=32):
    spec = compare.RunSpec(arm, n, rollouts // n, seed, compare.ARMS[arm].estimator, compare.ARMS[arm].overrides)
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
    assert (a.lr, a.steps, a.settings_commit) == (DemoSettings.lr, 100, None)


def test_script_refuses_an_out_folder_made_with_other_settings(tmp_path, monkeypatch):
    script = load_script("compare_cpu")
    out = tmp_path / "out"
    spec = compare.grid([("grpo", 4)], 32, [0])[0]
    folder = compare.fresh_run_dir(out, spec)
    (folder / compare.RESULT_FILE).write_text(json.dumps({"settings": {"steps": "5"}, "spec": {}}))
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
        compare.fresh_run_dir(out, spec)
        compare.save_result(out, spec, {"spec": {}, "settings": {}})

    monkeypatch.setattr(script, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(compare, "run_one", run_one)
    (tmp_path / "out").mkdir()
    with pytest.raises(SystemExit, match=r"1 run\(s\) failed: grpo_n4_seed0.*run the same command again"):
        script.main(["--out", str(tmp_path / "out"), "--arms", "grpo:4", "spo:1", "--seeds", "0",
                     "--docs", str(tmp_path / "bench.md")])
    assert ran == ["grpo_n4_seed0", "spo_n1_seed0"] and not (tmp_path / "bench.md").exists()


def test_report_writes_the_finished_runs_marked_partial_and_runs_nothing(tmp_path, monkeypatch, capsys):
    script = load_script("compare_cpu")
    key = {"settings": "of this comparison"}
    monkeypatch.setattr(compare, "settings_key", lambda s: key)
    monkeypatch.setattr(script, "prepare", lambda *a, **k: pytest.fail("--report prepared a run"))
    monkeypatch.setattr(compare, "run_one", lambda *a, **k: pytest.fail("--report started a run"))
    out, doc = tmp_path / "out", tmp_path / "bench.md"
    doc.write_text(f"# Bench\n\n{compare_report.BEGIN}\nnot in yet\n{compare_report.END}\n")
    args = ["--out", str(out), "--arms", "grpo:8", "spo_sampler:1", "--train-prompts", "64", "--seeds", "0", "1",
            "--docs", str(doc), "--report"]
    with pytest.raises(SystemExit, match="no run .* has finished yet"):
        script.main(args)
    for spec in script.parse_args(args).specs[:3]:  # seed 0 of both arms, seed 1 of grpo
        compare.fresh_run_dir(out, spec)
        record = _result(spec.arm, spec.n, spec.seed, 0.5 + 0.01 * spec.seed)
        record["summary"]["sampler/weight_entropy"] = 4.0
        compare.save_result(out, spec, {**record, "settings": key})
    script.main(args)
    text = doc.read_text()
    assert "**Partial results: 3 of 4 runs.** Not run yet: spo_sampler_n1_seed1." in text
    assert "not in yet" not in text and "wall for this invocation" not in text
    command = next(line for line in text.splitlines() if line.startswith("python scripts/compare_cpu.py"))
    assert "--report" not in command and "| grpo n=8 (4 prompts) | 2 |" in text  # the command that completes it
    assert "train prompts=64" in text and "reference=grpo:8" in text
    assert "| spo_sampler n=1 (32 prompts) | 4.000 |" in text  # the sampler's table
    compare.fresh_run_dir(out, script.parse_args(args).specs[3])  # every run finished: --report still ran none
    compare.save_result(out, script.parse_args(args).specs[3], {**_result("spo_sampler", 1, 1, 0.5), "settings": key})
    script.main(args)
    text = doc.read_text()
    assert "Partial results" not in text and "wall for this invocation" not in text
    monkeypatch.setattr(script, "prepare", lambda *a, **k: None)
    script.main([arg for arg in args if arg != "--report"])  # the command itself, once every run has finished
    text = doc.read_text()
    assert "Partial results" not in text and "wall for this invocation" not in text  # it ran no verl run either
