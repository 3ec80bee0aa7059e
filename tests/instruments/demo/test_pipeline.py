"""The demo's run is the committed comparison's run of its arm (its settings, composed into verl's real config), the
checks that run before any expensive work and the command line's refusals, and the demo's stages end to end with verl
replaced by a run folder written like verl writes it (tests/instruments/_fake_run.py); beside them, the one verl run's
overrides and guards the demo stands on (instruments/run/verl_run.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from instruments.cpu.launch import DEFAULT_CPU_CONFIG
from instruments.demo import pipeline
from instruments.demo.pipeline import check_demo, demo_settings
from instruments.run import reward
from instruments.run import settings as run_settings
from instruments.run.prepare import prepare
from instruments.run.settings import Prepared, RunSettings
from instruments.run.verl_run import verl_overrides
from tests._scripts import load_script
from tests.instruments._fake_run import QUESTION_FAMILY, write_fake_run


def _compose(overrides: list[str]):
    GlobalHydra.instance().clear()
    # as verl's main_ppo composes: from its config module, ours found through the search-path plugin
    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose(DEFAULT_CPU_CONFIG, overrides=overrides)  # what the launcher runs, by name


def test_overrides_compose_with_verl_config_as_main_ppo_would(tmp_path):
    s = RunSettings(work_dir=tmp_path)
    prepared = Prepared(model=tmp_path / "model", train=tmp_path / "train.parquet", val=tmp_path / "val.parquet",
                        codebook=tmp_path / "codebook.npz")
    config = _compose(verl_overrides(s, "grpo", prepared, tmp_path / "run", n=2, batch=16, seed=3))
    rollout, trainer = config.actor_rollout_ref.rollout, config.trainer
    assert config.algorithm.adv_estimator == "grpo"
    assert (rollout.n, config.data.train_batch_size, config.actor_rollout_ref.actor.ppo_mini_batch_size) == (2, 16, 16)
    assert (config.data.seed, rollout.seed, config.actor_rollout_ref.actor.optim.lr) == (3, 3, s.lr)
    # validation: verl's loop on the held-out file, before training and every test_freq steps, sampled at T=1
    assert config.data.val_files == str(prepared.val) and trainer.val_before_train is True
    assert trainer.test_freq == s.test_freq and trainer.validation_data_dir == str(tmp_path / "run" / "validation")
    assert (rollout.val_kwargs.n, rollout.val_kwargs.do_sample, rollout.val_kwargs.temperature) == (
        s.val_samples, True, 1.0)
    assert rollout.val_kwargs.top_p == 1.0 and rollout.val_kwargs.top_k == -1  # plain sampling, like training
    assert (config.reward.custom_reward_function.path, config.reward.custom_reward_function.name) == (
        reward.PATH, reward.LAST_NUMBER_NAME)  # the model answers with the number only
    assert trainer.total_training_steps == s.steps and trainer.save_freq == -1
    defaults = _compose(verl_overrides(s, "bv_blend", prepared, tmp_path / "run"))
    assert (defaults.actor_rollout_ref.rollout.n, defaults.data.train_batch_size) == (s.n, s.batch)


def test_a_run_without_its_own_start_skips_only_its_validation_before_training(tmp_path):
    """A resumed comparison run (instruments/compare/runs.py) skips its step-0 validation; nothing else changes."""
    s = RunSettings(work_dir=tmp_path)
    prepared = Prepared(model=tmp_path / "model", train=tmp_path / "train.parquet", val=tmp_path / "val.parquet",
                        codebook=tmp_path / "codebook.npz")
    first = _compose(verl_overrides(s, "grpo", prepared, tmp_path / "run"))
    second = _compose(verl_overrides(s, "grpo", prepared, tmp_path / "run", val_before_train=False))
    assert (first.trainer.val_before_train, second.trainer.val_before_train) == (True, False)
    second.trainer.val_before_train = True
    assert first == second  # the same validation: file, sampling, responses per prompt, scorer
    assert first.actor_rollout_ref.rollout.val_kwargs.n == s.val_samples == 8


def test_the_demo_trains_the_comparison_s_arm_at_its_settings(tmp_path, monkeypatch):
    """The demo's run is the committed comparison's run of BV-Blend n = 2 (its result's settings, its lr and steps
    file, its command's budget a step) but for its validations: at the start and the end only."""
    monkeypatch.setattr(run_settings, "cpu_flags", lambda: {"avx512_bf16": True})  # this EPYC: no AMX, so fp32
    s = demo_settings(tmp_path)
    fixed = json.loads(pipeline.COMPARISON_SETTINGS.read_text())
    assert (s.lr, s.steps, s.test_freq) == (fixed["lr"], fixed["steps"], fixed["steps"])
    assert pipeline.differences_from_comparison(s) == [f"test_freq: 10 -> {fixed['steps']}"]
    assert f"--rollouts-per-step {pipeline.ROLLOUTS_PER_STEP} " in json.loads(
        pipeline.COMPARISON_SUMMARY.read_text())["command"]
    committed = json.loads((pipeline.COMPARISON_RUNS.parent / "prepared" / "prepared.json").read_text())
    assert s.preparation_key() == committed["key"]  # the comparison's task, split, pool and codebook
    estimator, n, overrides = pipeline.demo_arm()
    assert (estimator, n, overrides) == ("bv_blend", 2, ())
    prepared = Prepared(model=tmp_path / "model", train=tmp_path / "train.parquet", val=tmp_path / "val.parquet",
                        codebook=tmp_path / "codebook.npz")
    config = _compose(verl_overrides(s, estimator, prepared, tmp_path / "run", extra=overrides))
    rollout, trainer = config.actor_rollout_ref.rollout, config.trainer
    assert (config.algorithm.adv_estimator, rollout.n, config.data.train_batch_size) == ("bv_blend", 2, 32)
    assert config.actor_rollout_ref.actor.optim.lr == fixed["lr"] and trainer.total_training_steps == fixed["steps"]
    assert trainer.val_before_train is True and trainer.test_freq == fixed["steps"] and trainer.total_epochs == 1
    assert (rollout.val_kwargs.n, rollout.val_kwargs.temperature) == (4, 1.0)
    assert config.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    # each flag the user changes is a difference the report names
    assert pipeline.differences_from_comparison(demo_settings(tmp_path, lr=1e-4, seed=3)) == [
        "lr: 2e-05 -> 0.0001", "seed: 0 -> 3", f"test_freq: 10 -> {fixed['steps']}"]


def test_the_demo_s_settings_file_is_refused_where_it_is_missing_or_not_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file.*scripts/pretrained_settings.py"):
        pipeline.comparison_lr_steps(tmp_path / "absent.json")
    (tmp_path / "other.json").write_text('{"lr": 1e-5}')
    with pytest.raises(ValueError, match="not a settings file of scripts/pretrained_settings.py.*'steps'"):
        pipeline.comparison_lr_steps(tmp_path / "other.json")
    with pytest.raises(FileNotFoundError, match="holds no bv_blend_n2_seed"):
        pipeline.comparison_run_settings(tmp_path)


def test_the_demo_runs_its_one_run_and_reports_it_beside_the_comparison(tmp_path, monkeypatch):
    """run_demo's stages with a fake verl: one run of the arm, validated at its start and end, and report.txt,
    summary.json and held_out.png made from it; --report-only remakes them and runs nothing."""
    from instruments.cpu import launch

    prepared = Prepared(model=Path("m"), train=Path("t"), val=Path("v"), codebook=Path("c"),
                        question_family=QUESTION_FAMILY)
    monkeypatch.setattr(pipeline, "prepare", lambda s, reuse=False: prepared)
    runs: list[dict[str, str]] = []

    def fake_run_trainer(overrides, log_path, metrics_path, timeout_s, extra_env=None, run_id=None):
        o = dict(item.lstrip("+").split("=", 1) for item in overrides)
        runs.append(o)
        folder = Path(o["trainer.validation_data_dir"]).parent
        assert metrics_path == folder / "metrics.jsonl"
        write_fake_run(folder, o["algorithm.adv_estimator"])
        log_path.write_text("fake\n")
        return 0

    monkeypatch.setattr(launch, "run_trainer", fake_run_trainer)
    monkeypatch.setattr(run_settings, "cpu_flags", lambda: {"avx512_bf16": True})  # no AMX: fp32, the comparison's
    s = demo_settings(tmp_path, steps=4)
    text = pipeline.run_demo(s)
    assert [(r["algorithm.adv_estimator"], r["actor_rollout_ref.rollout.n"], r["data.train_batch_size"],
             r["trainer.val_before_train"], r["trainer.test_freq"]) for r in runs] == [
        ("bv_blend", "2", "32", "true", "4")]
    assert Path(runs[0]["trainer.validation_data_dir"]).parent == tmp_path / "runs" / "bv_blend_n2"
    assert (tmp_path / "report.txt").read_text().split("\n", 1)[1] == text + "\n"
    lines = text.splitlines()
    assert lines[0].startswith("BV-Blend cluster level n=2 (verl's algorithm.adv_estimator=bv_blend, 32 prompts x 2 "
                               "rollouts a step), 4 steps at lr 2e-05")
    assert "ONE run, seed 0; settings that differ from the comparison's: n_train: 1280 -> 256; steps: 20 -> 4" in (
        lines[0])
    # the fake run: 4 held-out prompts, 0.375 -> 0.625 (one prompt from 0 to 1): its interval holds zero
    assert any(line.startswith("this run (one seed): did not learn: the held-out pass rate went from 0.375 ")
               for line in lines)
    assert "the comparison's figures are of another setting" in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["run"]["verdict"] == "did not learn" and summary["run"]["seeds"] == 1
    assert summary["run"]["held out"]["all"]["gain"]["value"] == 0.25
    assert summary["run"]["held out"]["echo"]["verdict"] == "did not learn"
    assert summary["run"]["held out"]["tiny_sum"]["verdict"] is None  # one prompt: no interval, no verdict
    assert (tmp_path / "held_out.png").stat().st_size > 10_000
    # --report-only rewrites the same report from the run on disk, runs nothing, and keeps the run's wall time
    (tmp_path / "prepared.json").write_text("{}")  # the marker a real preparation leaves (prepare is faked here)
    monkeypatch.setattr(launch, "run_trainer", lambda *a, **k: pytest.fail("--report-only ran verl"))
    assert pipeline.run_demo(s, report_only=True) == text
    assert json.loads((tmp_path / "summary.json").read_text())["wall_s"] == summary["wall_s"]


def test_the_demo_refuses_before_it_writes_anything_and_names_the_fix(tmp_path):
    s = demo_settings(tmp_path / "out")
    check_demo(s)  # a new folder: nothing to refuse
    (tmp_path / "file").touch()
    for settings, report_only, error, message in [
        (replace(s, work_dir=tmp_path / "file"), False, ValueError, "is a file: pass a folder"),
        (s, True, FileNotFoundError, "holds no demo .*run it first, without --report-only"),
        (replace(s, model=str(tmp_path / "absent")), False, FileNotFoundError, "no such folder"),
        (replace(s, model=str(tmp_path)), False, FileNotFoundError, "no config.json"),
        (demo_settings(s.work_dir, steps=1000), False, ValueError,
         "pool needs 64000 distinct training prompts.*lower --steps"),
    ]:
        with pytest.raises(error, match=message):
            check_demo(settings, report_only)
    assert not s.work_dir.exists()  # nothing written by a refusal
    # a finished demo of other settings is not replaced by a new run; the same settings run again
    s.work_dir.mkdir()
    earlier = {k: str(v) for k, v in asdict(replace(s, lr=1e-4)).items()}
    (s.work_dir / "summary.json").write_text(json.dumps({"settings": earlier}))
    with pytest.raises(ValueError, match=r"other settings \(lr: 0.0001 -> 2e-05\).*Pass another --work-dir"):
        check_demo(s)
    check_demo(replace(s, lr=1e-4, work_dir=tmp_path / "." / "out"))  # its path written otherwise: the same folder


def test_the_demo_script_takes_the_comparison_s_settings_and_the_flags_on_top(monkeypatch, tmp_path):
    script = load_script("demo_cpu")
    monkeypatch.chdir(tmp_path)  # its default --work-dir, demo_out, is read from where it runs
    seen = {}
    monkeypatch.setattr(script, "run_demo", lambda s, report_only: seen.update(s=s, report_only=report_only) or "")
    script.main(["--steps", "4"])
    s = seen["s"]
    assert (s.model, s.task, s.distinct_train, s.lr, s.steps, s.batch, s.n, s.test_freq, s.n_train) == (
        "smollm2", "wide", True, 2e-5, 4, 32, 2, 4, 256)
    assert (s.val_prompts, s.val_samples, s.dtype, s.work_dir) == (120, 4, "auto", Path("demo_out"))
    script.main(["--test-freq", "10", "--lr", "1e-4", "--seed", "3", "--dtype", "fp32"])
    assert (seen["s"].test_freq, seen["s"].steps, seen["s"].lr, seen["s"].seed, seen["s"].dtype) == (
        10, 20, 1e-4, 3, "fp32")


def test_the_demo_script_refuses_bad_and_retired_flags_with_the_reason(monkeypatch, tmp_path, capsys):
    script = load_script("demo_cpu")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(script, "run_demo", lambda s, report_only: pytest.fail("a refused command ran"))
    (tmp_path / "file").touch()
    for argv, reason in (
        (["--steps", "0"], "--steps 0: must be >= 1"),
        (["--test-freq", "0"], "--test-freq 0: must be >= 1"),
        (["--lr=-1e-5"], "--lr -1e-05: must be > 0"),
        (["--work-dir", "file"], "is a file: pass a folder"),
        (["--report-only"], "holds no demo"),
        (["--recommended"], "unrecognized arguments: --recommended"),  # one method: the second run is gone
        (["--batch", "16"], "unrecognized arguments"),  # the comparison's sizes, not the user's
        (["--val-prompts", "100"], "unrecognized arguments"),
        (["--warmup-steps", "10"], "unrecognized arguments"),  # the tiny model's: a test fixture only
    ):
        with pytest.raises(SystemExit) as exit_:
            script.main(argv)
        assert exit_.value.code == 2 and reason in capsys.readouterr().err


def test_the_demo_script_shows_the_comparison_s_defaults(capsys):
    script = load_script("demo_cpu")
    with pytest.raises(SystemExit):
        script.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    fixed = json.loads(pipeline.COMPARISON_SETTINGS.read_text())
    assert f"RL steps (default {fixed['steps']}, the comparison's: pretrained_lm_settings.json)" in shown
    assert f"(default {fixed['lr']:g}, the comparison's)" in shown
    assert "default: --steps, that is before the first update and after the last only" in shown


def test_training_rows_cover_every_step_of_the_single_epoch(tmp_path):
    assert RunSettings(work_dir=tmp_path, steps=30, batch=16).n_train == 480
    assert RunSettings(work_dir=tmp_path, n_train=5000).n_train == 5000


def test_reusing_a_preparation_made_with_other_settings_is_refused(tmp_path):
    marker = tmp_path / "prepared.json"
    marker.write_text('{"key": {"warmup_steps": "1"}}')
    with pytest.raises(ValueError, match="was prepared with other settings"):
        prepare(RunSettings(work_dir=tmp_path), reuse=True)
    assert marker.read_text() == '{"key": {"warmup_steps": "1"}}'


def test_warmup_refuses_a_format_share_outside_0_1():
    from instruments.run.tiny import supervised_warmup

    with pytest.raises(ValueError, match="format_share=0.0 must be in"):
        supervised_warmup(model=None, tokenizer=None, steps=1, format_share=0.0)



def test_clusters_per_family_counts_annotated_rows(tmp_path):
    import pandas as pd

    from bv_blend.codebook import CLUSTER_KEY
    from instruments.run.prepare import clusters_per_family

    rows = [("echo", 0), ("echo", 3), ("echo", 0), ("big_sum", 6)]
    pd.DataFrame({"extra_info": [{"family": f, CLUSTER_KEY: c} for f, c in rows]}).to_parquet(tmp_path / "t.parquet")
    assert clusters_per_family(tmp_path / "t.parquet") == {"echo": {0: 2, 3: 1}, "big_sum": {6: 1}}


def test_the_demo_says_which_cpu_it_runs_on_before_anything_else(tmp_path, monkeypatch, capsys):
    from instruments.demo import pipeline
    from instruments.machine import describe_cpu

    def stop(*args, **kwargs):
        raise RuntimeError("stopped after the first line")

    monkeypatch.setattr(pipeline, "prepare", stop)
    with pytest.raises(RuntimeError, match="stopped"):
        pipeline.run_demo(RunSettings(work_dir=tmp_path))
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"[demo] {describe_cpu()}" and first.startswith("[demo] CPU: ")


def test_a_pretrained_runs_hang_guard_grows_with_its_steps():
    """The fixed 30-minute guard killed SmolLM2's 40-step runs (the settings sweep's first run, 2026-12-03): the
    bound grows with the steps, and an explicit one wins."""
    from instruments.run import settings as run_settings

    smol = RunSettings(work_dir=Path("w"), steps=40, model="smollm2")
    assert smol.run_timeout_s() == run_settings.PRETRAINED_START_TIMEOUT_S + 40 * run_settings.PRETRAINED_STEP_TIMEOUT_S
    assert smol.run_timeout_s() > 40 * 157  # the slowest step measured, beside another job
    assert RunSettings(work_dir=Path("w"), model="smollm2", timeout_s=60.0).run_timeout_s() == 60.0


def test_a_run_empties_its_folder_unless_the_caller_prepared_it(tmp_path, monkeypatch):
    """The demo's runs start in an emptied folder; the comparison's keep what it prepared there (a resumed run's
    earlier attempts: the bug this guards, where the first attempt's record was wiped by the run it recorded)."""
    from instruments.cpu import launch
    from instruments.run import verl_run

    prepared = Prepared(model=Path("m"), train=Path("t"), val=Path("v"), codebook=Path("c"),
                        question_family=QUESTION_FAMILY)
    monkeypatch.setattr(launch, "run_trainer", lambda overrides, **run: 0)
    s = RunSettings(work_dir=tmp_path, steps=4, test_freq=2)
    folder = tmp_path / "run"
    for empty_first, kept in ((False, True), (True, False)):
        folder.mkdir(exist_ok=True)
        (folder / "attempts.json").write_text("[]")
        verl_run.run_method(s, "grpo", prepared, folder, empty_first=empty_first)
        assert (folder / "attempts.json").exists() == kept


def test_a_run_records_the_most_memory_its_processes_held(tmp_path, monkeypatch):
    """What the comparison's memory check and the docs read: the trainer is replaced by a real process that carries
    the run's marker, as verl's processes do, and holds a known buffer (verl itself: the e2e runs and docs/cpu.md)."""
    from instruments.cpu import launch, memory
    from instruments.run import verl_run
    from tests.instruments.cpu.test_run_memory import HOLD_MIB, HOLDER

    seen = threading.Event()  # the watch has sampled this run (on a loaded machine a sample can take a second)
    this_run: list[str] = []  # other tests' marked processes may be live beside it
    real_sample = memory.MemoryWatch.sample

    def sample(watch, *args, **kwargs):
        began_after_ready = bool(this_run)
        real_sample(watch, *args, **kwargs)
        if began_after_ready and this_run[0] in watch.runs:
            seen.set()

    def trainer_holding_memory(overrides, log_path, metrics_path, timeout_s, extra_env, run_id):
        env = {k: v for k, v in os.environ.items() if k != launch.RUN_ID_ENV}
        holder = subprocess.Popen([sys.executable, "-c", HOLDER], env={**env, launch.RUN_ID_ENV: run_id},
                                  stdout=subprocess.PIPE)
        try:
            assert holder.stdout.readline().strip() == b"ready"
            this_run.append(run_id)  # samples from before the buffer was resident do not count
            assert seen.wait(60), "the watch never saw the run"
        finally:
            holder.kill()
            holder.wait()
        return 0

    prepared = Prepared(model=Path("m"), train=Path("t"), val=Path("v"), codebook=Path("c"),
                        question_family=QUESTION_FAMILY)
    monkeypatch.setattr(launch, "run_trainer", trainer_holding_memory)
    monkeypatch.setattr(memory.MemoryWatch, "sample", sample)
    monkeypatch.setattr(verl_run, "MEMORY_SAMPLE_S", 0.05)
    folder = verl_run.run_method(RunSettings(work_dir=tmp_path, steps=4, test_freq=2), "grpo", prepared,
                                 tmp_path / "run")
    held = json.loads((folder / verl_run.MEMORY_FILE).read_text())
    assert HOLD_MIB / 1024 <= held["peak_memory_gib"] < HOLD_MIB / 1024 + 0.25
    assert 0 < held["least_available_gib"] < float("inf")


def test_a_pretrained_run_waits_longer_for_each_weight_bucket_unless_the_user_says(monkeypatch):
    """The 60 s deadline on a weight bucket's acknowledgement killed a SmolLM2 fp32 run on a loaded machine."""
    from instruments.cpu.rollout_patches import SYNC_TIMEOUT_ENV
    from instruments.run import verl_run

    monkeypatch.delenv(SYNC_TIMEOUT_ENV, raising=False)
    smol = RunSettings(work_dir=Path("w"), model="smollm2")
    assert verl_run.run_env(smol) == {SYNC_TIMEOUT_ENV: str(verl_run.PRETRAINED_SYNC_TIMEOUT_S)}
    monkeypatch.setenv(SYNC_TIMEOUT_ENV, "90")
    assert verl_run.run_env(smol) == {}  # the user's value passes through run_trainer's environment
