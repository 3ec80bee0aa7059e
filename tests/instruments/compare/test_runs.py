"""scripts/compare_cpu.py's arms and bookkeeping (resume, memory, refusals), without verl runs: the verl run is
replaced by a folder written like verl writes it (tests/demo/_fake_run.py). The arms' overrides are composed with
verl's real config. The statistics, the docs and the script's face: tests/demo/test_compare_report.py."""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from instruments import provenance
from instruments.compare import arms as compare_arms
from instruments.compare import report as compare_report
from instruments.compare import runs as compare_runs
from instruments.cpu.launch import DEFAULT_CPU_CONFIG
from instruments.run import report, run_logs
from instruments.run.settings import Prepared, RunSettings
from instruments.run.verl_run import MEMORY_FILE, STOP_FILE, verl_overrides
from tests._scripts import load_script
from tests.instruments._fake_run import QUESTION_FAMILY, write_fake_run


# ------------------------------------------------------------------------------------------------------- arms
def test_grid_gives_every_arm_the_same_rollout_budget_seeds_outermost():
    specs = compare_arms.grid([("grpo", 8), ("spo", 1), ("spo_sampler", 1), ("bv_blend_prompt", 2)], 32, [0, 1])
    assert [(s.arm, s.n, s.batch, s.seed, s.estimator) for s in specs[:4]] == [
        ("grpo", 8, 4, 0, "grpo"), ("spo", 1, 32, 0, "spo"), ("spo_sampler", 1, 32, 0, "spo"),
        ("bv_blend_prompt", 2, 16, 0, "bv_blend")]
    assert [s.seed for s in specs] == [0] * 4 + [1] * 4
    assert len(specs) == 8 and {s.n * s.batch for s in specs} == {32}
    assert len({s.name for s in specs}) == 8 and specs[2].name == "spo_sampler_n1_seed0"
    assert specs[2].samples_by_history and not specs[1].samples_by_history
    assert specs[2].overrides == compare_arms.SAMPLER and specs[3].overrides == compare_arms.PROMPT_LEVEL
    # the same arm at two group sizes is two arms
    assert [s.name for s in compare_arms.grid([("grpo", 4), ("grpo", 2)], 8, [0])] == ["grpo_n4_seed0", "grpo_n2_seed0"]


@pytest.mark.parametrize(("arms", "seeds", "match"), [
    ([("grpo", 3)], [0], "group size 3 of grpo must be >= 1 and divide --rollouts-per-step 32"),
    ([("spo", 0)], [0], "group size 0 of spo must be >= 1"),
    ([("nope", 4)], [0], "unknown arm 'nope'; the arms are grpo, bv_blend"),
    ([("grpo", 4), ("grpo", 4)], [0], "must not repeat"),
    ([("grpo", 4)], [1, 1], "must not repeat"),
])
def test_grid_refuses_bad_settings(arms, seeds, match):
    with pytest.raises(ValueError, match=match):
        compare_arms.grid(arms, 32, seeds)


def test_arms_are_parsed_as_arm_colon_group_size():
    assert compare_arms.parse_arm("spo_sampler:1") == ("spo_sampler", 1)
    for text, match in [("grpo", "not ARM:N"), ("grpo:x", "not ARM:N"), ("gpro:8", "unknown arm 'gpro'")]:
        with pytest.raises(ValueError, match=match):
            compare_arms.parse_arm(text)


def test_the_pool_is_steps_times_the_largest_batch_unless_given():
    specs = compare_arms.grid([("grpo", 8), ("spo", 1)], 32, [0])
    assert compare_arms.pool_size(specs, 60, None) == 60 * 32  # the old behaviour: every row seen once
    assert compare_arms.pool_size(specs, 60, 320) == 320
    with pytest.raises(ValueError, match="smaller than the largest batch"):
        compare_arms.pool_size(specs, 60, 16)


def _compose(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose(DEFAULT_CPU_CONFIG, overrides=overrides)  # what the launcher runs, by name


def _prepared(tmp_path: Path) -> Prepared:
    return Prepared(model=tmp_path / "model", train=tmp_path / "train.parquet", val=tmp_path / "val.parquet",
                    codebook=tmp_path / "codebook.npz")


@pytest.mark.parametrize("arm", list(compare_arms.ARMS))
def test_every_arm_composes_with_verl_config_and_a_small_pool_gets_the_epochs_it_needs(tmp_path, arm):
    """Every key an arm overrides exists in verl's config (hydra refuses unknown keys), and a pool of 320 rows runs
    60 steps: verl stops after trainer.total_epochs passes, whatever total_training_steps says."""
    spec = compare_arms.grid([(arm, 1)], 32, [3])[0]
    s = RunSettings(work_dir=tmp_path, steps=60, n_train=320)
    priors = tmp_path / "priors.json"
    config = _compose(verl_overrides(s, spec.estimator, _prepared(tmp_path), tmp_path / "run", n=spec.n,
                                     batch=spec.batch, seed=spec.seed, extra=compare_arms.run_overrides(spec, priors)))
    assert config.algorithm.adv_estimator == compare_arms.ARMS[arm].estimator
    # an arm with priors reads the preparation's file, under the option of its estimator; no other arm reads one
    reads = {"spo": config.algorithm.get("spo", {}).get("offline_values"),
             "bv_blend": config.algorithm.bv_blend.prior_file}
    assert reads == {e: str(priors) if compare_arms.ARMS[arm].reads_priors and e == spec.estimator else None
                     for e in reads}
    assert (config.actor_rollout_ref.rollout.n, config.data.train_batch_size) == (1, 32)
    assert config.data.history_sampler.enable is compare_arms.ARMS[arm].samples_by_history
    if compare_arms.ARMS[arm].samples_by_history:  # what bv_blend/verl/sampler.py requires
        assert config.data.shuffle is True and config.data.dataloader_num_workers == 0
    level = "prompt_and_cluster" if "prompt" in arm else "cluster"
    assert config.algorithm.bv_blend.history_level == level
    # 320 // 32 = 10 batches an epoch: 6 epochs for 60 steps
    assert (config.trainer.total_epochs, config.trainer.total_training_steps) == (6, 60)


def test_the_epochs_follow_the_pool_and_an_arm_cannot_override_the_demos_keys(tmp_path):
    s = RunSettings(work_dir=tmp_path, steps=60, n_train=320)
    overrides = verl_overrides(s, "grpo", _prepared(tmp_path), tmp_path / "run", n=8, batch=4)
    assert "trainer.total_epochs=1" in overrides  # 80 batches of 4 an epoch
    default = RunSettings(work_dir=tmp_path, steps=60)  # the demo: steps x batch rows, one epoch as before
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
    s = RunSettings(work_dir=tmp_path / "prepared", steps=4, test_freq=2)
    prepared = Prepared(model=Path("m"), train=Path("t"), val=Path("v"), codebook=Path("c"),
                        question_family=QUESTION_FAMILY)
    return s, prepared, tmp_path / "out", compare_runs.settings_key(s)


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
    specs = compare_arms.grid([("grpo", 4), ("bv_blend_prompt", 4)], 8, [0])
    calls: list = []
    monkeypatch.setattr(compare_runs, "run_method", _fake_verl(calls, interrupt_for=specs[1].name))
    compare_runs.run_one(s, prepared, out, specs[0], key)
    with pytest.raises(KeyboardInterrupt):
        compare_runs.run_one(s, prepared, out, specs[1], key)
    # the interrupted run left files but no result: it is still pending, the finished one is not
    assert (compare_runs.run_dir(out, specs[1]) / "metrics.jsonl").exists()
    assert compare_runs.pending(out, specs, key) == [specs[1]]
    fresh = {"own_start": True, "empty_first": False, "checkpoint_every": s.test_freq, "resume_from": None}
    assert calls == [("grpo", {"n": 4, "batch": 2, "seed": 0, "extra": (), **fresh}),
                     ("bv_blend", {"n": 4, "batch": 2, "seed": 0, "extra": compare_arms.PROMPT_LEVEL, **fresh})]
    # restart: only the pending run runs again, in an emptied folder (it left no checkpoint to resume from)
    (compare_runs.run_dir(out, specs[1]) / "leftover.txt").write_text("from the interrupted attempt")
    monkeypatch.setattr(compare_runs, "run_method", _fake_verl(calls))
    for spec in compare_runs.pending(out, specs, key):
        compare_runs.run_one(s, prepared, out, spec, key)
    assert compare_runs.pending(out, specs, key) == []
    assert not (compare_runs.run_dir(out, specs[1]) / "leftover.txt").exists()
    assert [c[0] for c in calls] == ["grpo", "bv_blend", "bv_blend"]
    result = compare_runs.load_result(out, specs[1], key)
    assert result["spec"]["arm"] == "bv_blend_prompt" and set(result["validation"]) == {"0", "2", "4"}
    assert result["summary"]["signal ratio"] == pytest.approx(0.875)
    # the result names the attempt it replaced: when it started, from which commit, how far it came
    (replaced,) = result["replaced_attempts"]
    assert replaced["reached_step"] == 0  # its log was cut before any step it logged
    assert replaced["attempts"][0]["commit"] == result["commit"]
    assert "replaced_attempts" not in compare_runs.load_result(out, specs[0], key)


def test_a_run_records_the_commit_it_started_from_not_one_made_while_it_ran(setup, monkeypatch):
    """The commit is read as each attempt starts: a commit made during the run (or a tree edited meanwhile) does not
    become the run's."""
    s, prepared, out, key = setup
    spec = compare_arms.grid([("grpo", 4)], 8, [0])[0]
    monkeypatch.setattr(provenance, "code_commit", lambda: "a1b2c3d")
    fake = _fake_verl([])

    def commits_while_running(*args, **kwargs):
        monkeypatch.setattr(provenance, "code_commit", lambda: "e4f5a6b+dirty")
        monkeypatch.setattr(compare_runs, "code_commit", lambda: "e4f5a6b+dirty")
        return fake(*args, **kwargs)

    monkeypatch.setattr(compare_runs, "run_method", commits_while_running)
    result = compare_runs.run_one(s, prepared, out, spec, key)
    assert result["commit"] == "a1b2c3d" and result["tree_clean"] is True
    saved = json.loads((compare_runs.run_dir(out, spec) / "result.json").read_text())
    assert saved["commit"] == "a1b2c3d"


def test_dynamic_samplings_result_counts_every_prompt_and_rollout_it_drew():
    """verl logs dropped prompt groups per step; the result adds them to each step's batch: 2 steps of 4 prompts x 8,
    with 3 and 1 groups dropped, drew 12 prompts and 96 rollouts."""
    result = {"spec": {"n": 8, "batch": 4},
              "filter_groups": {"evicted_samples": {"1": 2.0, "2": 1.0}, "discarded_surplus_samples": {"1": 1.0}}}
    assert compare_runs.drawn_record(result, 2) == {"drawn": {"prompts": 12.0, "rollouts": 96.0}}
    assert compare_runs.drawn_record({"spec": {"n": 8, "batch": 4}}, 2) == {}


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
    spec = compare_arms.grid([("bv_blend", 4)], 8, [0])[0]
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
        assert compare_runs.resume.checkpoint_steps(folder) == [2]
        _copy_steps(whole, folder, range(3, 5))
        (folder / "checkpoints" / "global_step_4").mkdir()
        return folder

    monkeypatch.setattr(compare_runs, "run_method", first_attempt)
    with pytest.raises(KeyboardInterrupt):
        compare_runs.run_one(s, prepared, out, spec, key)
    folder = compare_runs.run_dir(out, spec)
    assert compare_runs.resume.resume_step(folder) == 2
    monkeypatch.setattr(compare_runs, "run_method", second_attempt)
    result = compare_runs.run_one(s, prepared, out, spec, key)
    assert [(c["own_start"], c["resume_from"]) for c in calls] == [
        (True, None), (False, folder / "checkpoints" / "global_step_2")]
    assert result["resumed_from_steps"] == [2] and result["attempt_cpus"] == [result["cpu"]] * 2
    assert result["attempt_commits"] == [result["commit"]] * 2
    attempts = compare_runs.resume.read_attempts(folder)
    assert result["attempt_started_utc"] == [a["started_utc"] for a in attempts]
    assert result["attempt_started_utc"][0] == result["started_utc"] and len(result["attempt_started_utc"]) == 2
    assert result["attempt_tree_clean"] == [a["tree_clean"] for a in attempts]
    assert (folder / "metrics.part1.jsonl").is_file() and (folder / "verl.part1.log").read_text() == "attempt 1\n"
    assert not (folder / "checkpoints").exists(), "a finished run keeps its ~1.6 GB checkpoints"
    assert len(compare_runs.resume.read_attempts(folder)) == 2

    monkeypatch.setattr(compare_runs, "run_method", _fake_verl([]))
    uninterrupted = compare_runs.run_one(s, prepared, out.parent / "out2", spec, key)
    same = ("validation", "families_after", "signal", "visits")
    assert {k: result[k] for k in same} == {k: uninterrupted[k] for k in same}
    timeless = {k: v for k, v in result["summary"].items() if "time" not in k and "steps s" not in k}
    other = {k: v for k, v in uninterrupted["summary"].items() if k in timeless}
    assert json.dumps(timeless, sort_keys=True) == json.dumps(other, sort_keys=True)  # NaN is NaN here


def test_a_result_keeps_the_most_memory_its_attempts_held_which_the_next_run_needs(setup, monkeypatch):
    """Each attempt's memory.json (instruments/run/verl_run.py writes it after verl exits) goes into its record; the
    result keeps the largest; an attempt that measured nothing does not inherit an earlier attempt's file."""
    s, prepared, out, key = setup
    specs = compare_arms.grid([("grpo", 4), ("bv_blend", 4)], 8, [0])
    assert compare_runs.memory_needed(out, specs, key) is None

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

    monkeypatch.setattr(compare_runs, "run_method", holding(7.5))
    assert compare_runs.run_one(s, prepared, out, specs[0], key)["peak_memory_gib"] == 7.5
    assert compare_runs.memory_needed(out, specs, key) == (7.5, specs[0].name)
    monkeypatch.setattr(compare_runs, "run_method", holding(9.0, range(0, 4), interrupt=True))
    with pytest.raises(KeyboardInterrupt):
        compare_runs.run_one(s, prepared, out, specs[1], key)
    monkeypatch.setattr(compare_runs, "run_method", holding(None, range(3, 5)))  # the resumed attempt measured nothing
    result = compare_runs.run_one(s, prepared, out, specs[1], key)
    attempts = compare_runs.resume.read_attempts(compare_runs.run_dir(out, specs[1]))
    assert "peak_memory_gib" not in attempts[-1] and result["resumed_from_steps"] == [2]
    assert "peak_memory_gib" not in result  # the first attempt died before its record was closed
    assert compare_runs.memory_needed(out, specs, key) == (7.5, specs[0].name)


def test_the_script_starts_no_run_the_machine_cannot_hold(tmp_path, monkeypatch):
    """A finished run held more than is available now (here: far more than any machine has): the next run is
    refused before verl starts, naming the need, unless --no-memory-check."""
    script = load_script("compare_cpu")
    out = tmp_path / "out"
    first, second = compare_arms.grid([("grpo", 4), ("spo", 1)], 32, [0])
    argv = ["--out", str(out), "--arms", "grpo:4", "spo:1", "--seeds", "0", "--docs", str(tmp_path / "bench.md")]
    key = compare_runs.settings_key(script.demo_settings(script.parse_args(argv)))
    compare_runs.fresh_run_dir(out, first)
    compare_runs.save_result(out, first, {"spec": first.describe(), "settings": key, "peak_memory_gib": 1e6})
    ran = []
    monkeypatch.setattr(script, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(compare_runs, "run_one", lambda s, prepared, out, spec, key, on_step: ran.append(spec.name))
    monkeypatch.setattr(script, "write_report", lambda *a, **k: None)
    with pytest.raises(SystemExit, match=r"held 1000000\.0 GiB \(the most of this comparison's finished runs, "
                                         r"grpo_n4_seed0\).*--no-memory-check starts the run anyway"):
        script.main(argv)
    assert ran == []
    script.main([*argv, "--no-memory-check"])
    assert ran == [second.name]


def test_runs_only_runs_the_pending_runs_and_writes_no_report(tmp_path, monkeypatch):
    """A frozen worktree's runner stays clean: --runs-only runs what is pending and leaves --docs untouched;
    --report beside it is refused (one runs nothing, the other reports nothing)."""
    script = load_script("compare_cpu")
    docs = tmp_path / "bench.md"
    argv = ["--out", str(tmp_path / "out"), "--arms", "grpo:4", "spo:1", "--seeds", "0", "--docs", str(docs)]
    ran, reported = [], []
    monkeypatch.setattr(script, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(compare_runs, "run_one", lambda s, prepared, out, spec, key, on_step: ran.append(spec.name))
    monkeypatch.setattr(script, "write_report", lambda *a, **k: reported.append(a))
    script.main([*argv, "--runs-only"])
    assert ran == ["grpo_n4_seed0", "spo_n1_seed0"] and reported == [] and not docs.exists()
    with pytest.raises(SystemExit):
        script.parse_args([*argv, "--runs-only", "--report"])
    script.main(argv)
    assert len(reported) == 1


def test_a_run_verl_finished_whose_reading_failed_is_read_again_not_resumed(setup, monkeypatch):
    """verl exited 0 and the reader raised (a model's U+2028 in a dump, before bv_blend.core.jsonl): the rerun reads
    the folder as it is. Resuming from its last checkpoint would have trained a step past the run's end."""
    s, prepared, out, key = setup
    spec = compare_arms.grid([("grpo", 4)], 8, [0])[0]

    def finished_with_checkpoints(s, method, prepared, folder, **run):
        write_fake_run_into(folder, method)
        for step in (2, 4):
            (folder / "checkpoints" / f"global_step_{step}").mkdir(parents=True)
        return folder

    def broken_reader(*args, **kwargs):
        raise ValueError("a reader's bug")

    monkeypatch.setattr(compare_runs, "run_method", finished_with_checkpoints)
    monkeypatch.setattr(compare_runs.report, "read_run", broken_reader)
    with pytest.raises(ValueError, match="a reader's bug"):
        compare_runs.run_one(s, prepared, out, spec, key)
    folder = compare_runs.run_dir(out, spec)
    assert compare_runs.resume.completed(folder, s.steps) and not compare_runs.resume.completed(folder, s.steps + 1)
    verl_end = compare_runs.verl_ended_utc(compare_runs.resume.read_attempts(folder))

    monkeypatch.undo()
    monkeypatch.setattr(compare_runs, "run_method", lambda *a, **k: pytest.fail("verl ran again"))
    seen: list[int] = []
    result = compare_runs.run_one(s, prepared, out, spec, key, on_step=seen.append)
    assert set(result["validation"]) == {"0", "2", "4"} and "resumed_from_steps" not in result
    assert result["ended_utc"] == verl_end and seen == [s.steps]
    assert len(compare_runs.resume.read_attempts(folder)) == 1 and not (folder / "checkpoints").exists()


def test_an_open_attempt_is_not_taken_for_a_finished_run(tmp_path):
    from instruments.run import resume

    write_fake_run(tmp_path / "r")
    resume.start_attempt(tmp_path / "r", None)  # verl died after logging its last step, before the attempt closed
    assert not resume.completed(tmp_path / "r", 4)
    resume.finish_attempt(tmp_path / "r")
    assert resume.completed(tmp_path / "r", 4) and not resume.completed(tmp_path / "missing", 4)


def test_resume_step_needs_a_checkpoint_whose_step_was_logged(tmp_path):
    from instruments.run import resume

    assert resume.resume_step(tmp_path) is None  # nothing yet
    (tmp_path / "checkpoints" / "global_step_4").mkdir(parents=True)
    (tmp_path / "metrics.jsonl").write_text('{"step": 2, "data": {}}\n{"step": 3, "data": {}}\n{"step": 4, "da')
    assert resume.resume_step(tmp_path) is None  # step 4 half-written: not logged, and no earlier checkpoint
    (tmp_path / "checkpoints" / "global_step_2").mkdir()
    assert resume.resume_step(tmp_path) == 2


def test_a_changed_arm_definition_refuses_its_old_results(setup, monkeypatch):
    s, prepared, out, key = setup
    spec = compare_arms.grid([("spo", 1)], 8, [0])[0]
    monkeypatch.setattr(compare_runs, "run_method", _fake_verl([]))
    compare_runs.run_one(s, prepared, out, spec, key)
    assert compare_runs.pending(out, [spec], key) == []
    changed = compare_arms.RunSpec(spec.arm, spec.n, spec.batch, spec.seed, spec.estimator, ("algorithm.spo.x=1",))
    with pytest.raises(ValueError, match="was made with other settings"):
        compare_runs.pending(out, [changed], key)


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
    spec = compare_arms.grid([("spo_sampler", 1)], 4, [0])[0]

    def fake(s, method, prepared, folder, **run):
        write_fake_run_into(folder, method, rollouts=N1_ROLLOUTS, extra_metrics=SAMPLER_METRICS)
        for step, t in DUMP_TIMES.items():
            os.utime(folder / "rollouts" / f"{step}.jsonl", (t, t))
        return folder

    monkeypatch.setattr(compare_runs, "run_method", fake)
    summary = compare_runs.run_one(s, prepared, out, spec, key)["summary"]
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
    metrics = report.read_run_metrics(compare_runs.run_dir(out, spec))
    rollouts = compare_runs.run_dir(out, spec) / "rollouts"
    assert run_logs.between_steps_s(metrics, rollouts, resumed_from=[2]) == pytest.approx(5.0)
    table = compare_report.summary_table([compare_runs.load_result(out, spec, key)])
    row = table.loc["spo_sampler n=1 (4 prompts)"]
    assert row["all-equal % (right + wrong)"] == "100.0 (75.0 + 25.0)" and row["signal ratio"] == "n/a"
    assert row["max abs(A)"] == "7.00" and row["between steps s"] == "3.500"
    sampler = compare_report.sampler_table([compare_runs.load_result(out, spec, key)])
    assert sampler.loc["spo_sampler n=1 (4 prompts)", "sampler/weight_entropy"] == "7.500"


def test_progress_follows_the_last_step_verl_logged(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    seen: list[int] = []
    stop = threading.Event()
    follower = threading.Thread(target=compare_runs.follow_steps, args=(metrics, seen.append, stop, 0.01))
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
    spec = compare_arms.grid([("grpo", 4)], 8, [0])[0]
    folder = compare_runs.fresh_run_dir(out, spec)
    (folder / "result.tmp").write_text("{")
    assert compare_runs.pending(out, [spec], key) == [spec]


def test_results_made_with_other_settings_are_refused(setup, monkeypatch):
    s, prepared, out, key = setup
    spec = compare_arms.grid([("grpo", 4)], 8, [0])[0]
    monkeypatch.setattr(compare_runs, "run_method", _fake_verl([]))
    compare_runs.run_one(s, prepared, out, spec, key)
    other = compare_runs.settings_key(RunSettings(work_dir=s.work_dir, steps=8, test_freq=2))
    with pytest.raises(ValueError, match="was made with other settings.*Use another --out folder"):
        compare_runs.pending(out, [spec], other)
    # another pool is another setting
    bigger = compare_runs.settings_key(RunSettings(work_dir=s.work_dir, steps=4, test_freq=2, n_train=320))
    assert bigger != key and bigger["n_train"] == "320"


# ------------------------------------------------------------------------------------------- a rollout budget
# grpo_dynamic at n = 4, 2 prompts a step (8 rollouts): the prompt groups dynamic sampling dropped each step, so the
# steps generate 16, 12, 8 and 16 rollouts (28 by step 2, 36 by step 3, 52 by step 4)
DROPPED = {1: 2.0, 2: 1.0, 4: 2.0}
DYNAMIC_METRICS = {step: {"training/filter_groups/evicted_samples": g} for step, g in DROPPED.items()}


@pytest.fixture
def budget(tmp_path):
    """Six steps at most, stopped once 40 rollouts are generated: after step 4 of the fake run (validated at 4)."""
    s = RunSettings(work_dir=tmp_path / "prepared", steps=6, test_freq=2, stop_at_rollouts=40)
    prepared = Prepared(model=Path("m"), train=Path("t"), val=Path("v"), codebook=Path("c"),
                        question_family=QUESTION_FAMILY)
    spec = compare_arms.grid([("grpo_dynamic", 4)], 8, [0])[0]
    return s, prepared, tmp_path / "out", compare_runs.settings_key(s), spec


def _stop(folder: Path, step: int, rollouts: float, budget: int = 40) -> None:
    """What instruments/cpu/budget_stop.py writes from inside the trainer when it stops the run."""
    (folder / STOP_FILE).write_text(json.dumps({"step": step, "rollouts": rollouts, "stop_at_rollouts": budget}))


def test_a_budget_joins_the_settings_key_only_where_there_is_one(setup, budget):
    without = setup[3]
    s = budget[0]
    assert "stop_at_rollouts" not in without  # results made before the option keep their key
    assert budget[3]["stop_at_rollouts"] == "40"
    assert compare_runs.settings_key(RunSettings(work_dir=s.work_dir, steps=6, test_freq=2)) != budget[3]
    with pytest.raises(ValueError, match="stop_at_rollouts 0 must be a positive number"):
        RunSettings(work_dir=s.work_dir, stop_at_rollouts=0)


def test_a_run_stopped_at_its_budget_records_why_and_is_read_up_to_its_stop(budget, monkeypatch):
    s, prepared, out, key, spec = budget
    calls: list = []
    fake = _fake_verl(calls, extra_metrics=DYNAMIC_METRICS)

    def stopped_after_step_4(s, method, prepared, folder, **run):
        fake(s, method, prepared, folder, **run)
        _stop(folder, 4, 52.0)
        return folder

    monkeypatch.setattr(compare_runs, "run_method", stopped_after_step_4)
    result = compare_runs.run_one(s, prepared, out, spec, key)
    assert "rollouts_before" not in calls[0][1]  # a fresh start generated nothing before
    assert result["stopped"] == {"reason": "rollout budget", "step": 4, "rollouts": 52.0, "stop_at_rollouts": 40,
                                 "steps": 6}
    assert result["drawn"] == {"prompts": 13.0, "rollouts": 52.0}  # up to its stop, not its 6 steps
    assert set(result["validation"]) == {"0", "2", "4"}  # the point at the budget
    assert compare_runs.load_result(out, spec, key)["stopped"]["step"] == 4
    # a run stopped at its budget is finished: its reading again does not train it on
    folder = compare_runs.run_dir(out, spec)
    assert compare_runs.resume.completed(folder, s.steps)


def test_a_stop_that_disagrees_with_the_runs_metrics_or_settings_is_refused(budget, monkeypatch):
    s, prepared, out, key, spec = budget
    for step, rollouts, budget_of_run, match in ((4, 60.0, 40, "count 52 rollouts by step 4"),
                                                 (3, 36.0, 40, "metrics end at step 4"),
                                                 (4, 52.0, 50, "a budget of 50 rollouts; these settings' is 40")):
        fake = _fake_verl([], extra_metrics=DYNAMIC_METRICS)

        def stopped(s, method, prepared, folder, fake=fake, step=step, rollouts=rollouts, b=budget_of_run, **run):
            fake(s, method, prepared, folder, **run)
            _stop(folder, step, rollouts, b)
            return folder

        monkeypatch.setattr(compare_runs, "run_method", stopped)
        shutil.rmtree(out, ignore_errors=True)
        with pytest.raises(ValueError, match=match):
            compare_runs.run_one(s, prepared, out, spec, key)


def test_a_run_with_a_budget_resumes_counting_the_rollouts_its_earlier_attempts_generated(budget, monkeypatch):
    """The first attempt saved checkpoints at steps 2 and 4 and recorded its stop at step 4, then died in step 4's
    validation, before logging it. The run resumes from step 2 with the 28 rollouts that steps 1-2 generated; the dead
    attempt's stop goes (its step is trained again, and the budget decides again), and the resumed attempt stops at
    4."""
    s, prepared, out, key, spec = budget
    whole = write_fake_run(out.parent / "whole", "grpo", extra_metrics=DYNAMIC_METRICS)
    calls: list = []

    def first_attempt(s, method, prepared, folder, **run):
        calls.append(run)
        _copy_steps(whole, folder, range(0, 4))
        (folder / "checkpoints" / "global_step_2").mkdir(parents=True)
        (folder / "checkpoints" / "global_step_4").mkdir()
        _stop(folder, 4, 52.0)
        raise KeyboardInterrupt

    def second_attempt(s, method, prepared, folder, **run):
        calls.append(run)
        assert not (folder / STOP_FILE).exists(), "the dead attempt's stop, at a step trained again, was kept"
        _copy_steps(whole, folder, range(3, 5))
        _stop(folder, 4, 52.0)
        return folder

    monkeypatch.setattr(compare_runs, "run_method", first_attempt)
    with pytest.raises(KeyboardInterrupt):
        compare_runs.run_one(s, prepared, out, spec, key)
    monkeypatch.setattr(compare_runs, "run_method", second_attempt)
    result = compare_runs.run_one(s, prepared, out, spec, key)
    folder = compare_runs.run_dir(out, spec)
    assert "rollouts_before" not in calls[0]
    assert calls[1]["rollouts_before"] == 28.0 and calls[1]["resume_from"] == folder / "checkpoints" / "global_step_2"
    assert result["resumed_from_steps"] == [2] and result["stopped"]["step"] == 4
    assert result["drawn"] == {"prompts": 13.0, "rollouts": 52.0}


def test_the_script_passes_its_budget_to_every_run(tmp_path):
    script = load_script("compare_cpu")
    argv = ["--out", str(tmp_path / "out"), "--arms", "grpo:8", "grpo_dynamic:8", "--seeds", "0", "--steps", "20",
            "--rollouts-per-step", "64"]
    assert script.demo_settings(script.parse_args(argv)).stop_at_rollouts is None
    s = script.demo_settings(script.parse_args([*argv, "--stop-at-rollouts", "1280"]))
    assert s.stop_at_rollouts == 1280 and compare_runs.settings_key(s)["stop_at_rollouts"] == "1280"
    with pytest.raises(SystemExit):
        script.parse_args([*argv, "--stop-at-rollouts", "0"])
    regime = [*argv, "--distinct-train", "--regime-summary", str(tmp_path / "regime")]
    assert script.parse_args(regime).stop_at_rollouts is None
    with pytest.raises(SystemExit):  # the regime's summary reads every run at its settings' last step
        script.parse_args([*regime, "--stop-at-rollouts", "1280"])


def test_the_budgets_environment_reaches_the_trainer_only_where_there_is_one(tmp_path):
    from instruments.cpu import budget_stop
    from instruments.run.verl_run import budget_env

    assert budget_env(RunSettings(work_dir=tmp_path), tmp_path / "run") == {}
    s = RunSettings(work_dir=tmp_path, stop_at_rollouts=1280)
    assert budget_env(s, tmp_path / "run", 256.0) == {budget_stop.STOP_AT_ENV: "1280", budget_stop.BEFORE_ENV: "256.0",
                                                       budget_stop.RECORD_ENV: str(tmp_path / "run" / STOP_FILE)}
