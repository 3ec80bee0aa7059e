"""The demo's verl overrides compose with verl's real config (every key exists, values parse), the settings checks
that run before any expensive work, and the demo's stages end to end with verl replaced by run folders written like
verl writes them (tests/demo/_fake_run.py)."""

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
from instruments.demo.pipeline import DEMO_DEFAULTS, check_demo, demo_plan
from instruments.run import reward
from instruments.run.prepare import prepare
from instruments.run.settings import Prepared, RunSettings
from instruments.run.verl_run import verl_overrides
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


def test_the_second_run_skips_its_validation_before_training_and_nothing_else_changes(tmp_path):
    s = RunSettings(work_dir=tmp_path)
    prepared = Prepared(model=tmp_path / "model", train=tmp_path / "train.parquet", val=tmp_path / "val.parquet",
                        codebook=tmp_path / "codebook.npz")
    first = _compose(verl_overrides(s, "grpo", prepared, tmp_path / "run"))
    second = _compose(verl_overrides(s, "grpo", prepared, tmp_path / "run", val_before_train=False))
    assert (first.trainer.val_before_train, second.trainer.val_before_train) == (True, False)
    second.trainer.val_before_train = True
    assert first == second  # the same validation: file, sampling, responses per prompt, scorer
    assert first.actor_rollout_ref.rollout.val_kwargs.n == s.val_samples == 8


def test_the_demo_measures_one_shared_start_and_reports_gains_from_it(tmp_path, monkeypatch):
    """run_demo's stages with a fake verl: the first run validates before training (the shared start), the second
    does not, and table.txt and summary.json report both methods' gains from the shared start."""
    from instruments.cpu import launch
    from instruments.demo import pipeline

    prepared = Prepared(model=Path("m"), train=Path("t"), val=Path("v"), codebook=Path("c"),
                        question_family=QUESTION_FAMILY)
    monkeypatch.setattr(pipeline, "prepare", lambda s: prepared)
    runs: list[dict[str, str]] = []

    def fake_run_trainer(overrides, log_path, metrics_path, timeout_s, extra_env=None, run_id=None):
        o = dict(item.lstrip("+").split("=", 1) for item in overrides)
        runs.append(o)
        folder = Path(o["trainer.validation_data_dir"]).parent
        assert metrics_path == folder / "metrics.jsonl"
        write_fake_run(folder, o["algorithm.adv_estimator"], own_start=o["trainer.val_before_train"] == "true")
        log_path.write_text("fake\n")
        return 0

    monkeypatch.setattr(launch, "run_trainer", fake_run_trainer)
    s = RunSettings(work_dir=tmp_path, steps=4, test_freq=2, val_samples=2)
    table = pipeline.run_demo(s)
    assert [(r["trainer.experiment_name"], r["trainer.val_before_train"], r["actor_rollout_ref.rollout.val_kwargs.n"])
            for r in runs] == [("grpo", "true", "2"), ("bv_blend", "false", "2")]
    assert (tmp_path / "table.txt").read_text().split("\n", 1)[1] == table + "\n"
    assert table.startswith("shared start (step 0: the model before any RL step, validated once by verl, in the "
                            "grpo run")
    assert "gain from start (95% CI)" in table
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["start"]["pass rate"] == 0.375 and summary["start"]["samples per prompt"] == 2
    assert summary["runs"]["grpo"]["val before"] == summary["runs"]["bv_blend"]["val before"] == 0.375
    assert summary["runs"]["grpo"]["gain"] == 0.5 and summary["runs"]["bv_blend"]["gain"] == 0.25
    assert summary["runs"]["bv_blend"]["shared start"] == 1.0
    assert summary["bv_blend - grpo after"]["difference"] == -0.25
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    # --report-only rewrites the same table from the runs on disk, runs nothing, and keeps the runs' wall time
    monkeypatch.setattr(pipeline, "prepare", lambda s, reuse=False: prepared)
    (tmp_path / "prepared.json").write_text("{}")  # the marker a real preparation leaves (prepare is faked here)
    monkeypatch.setattr(launch, "run_trainer", lambda *a, **k: pytest.fail("--report-only ran verl"))
    assert pipeline.run_demo(s, report_only=True) == table
    assert json.loads((tmp_path / "summary.json").read_text())["wall_s"] == summary["wall_s"]


def test_training_rows_cover_every_step_of_the_single_epoch(tmp_path):
    assert RunSettings(work_dir=tmp_path, steps=30, batch=16).n_train == 480
    assert RunSettings(work_dir=tmp_path, n_train=5000).n_train == 5000


def test_the_demo_refuses_before_it_writes_anything_and_names_the_fix(tmp_path):
    s = RunSettings(work_dir=tmp_path / "out", **DEMO_DEFAULTS)
    check_demo(s)  # a new folder: nothing to refuse
    (tmp_path / "file").touch()
    too_many = RunSettings(work_dir=s.work_dir, **{**DEMO_DEFAULTS, "steps": 1000})
    for settings, report_only, error, message in [
        (replace(s, work_dir=tmp_path / "file"), False, ValueError, "is a file: pass a folder"),
        (s, True, FileNotFoundError, "holds no demo .*run it first, without --report-only"),
        (replace(s, model=str(tmp_path / "absent")), False, FileNotFoundError, "no such folder"),
        (replace(s, model=str(tmp_path)), False, FileNotFoundError, "no config.json"),
        (too_many, False, ValueError, "need 16000 distinct training prompts.*lower --steps or --batch"),
    ]:
        with pytest.raises(error, match=message):
            check_demo(settings, report_only)
    assert not s.work_dir.exists()  # nothing written by a refusal
    # a finished demo of other settings is not replaced by a new run; the same settings run again
    s.work_dir.mkdir()
    earlier = {k: str(v) for k, v in asdict(replace(s, lr=1e-4)).items()}
    (s.work_dir / "summary.json").write_text(json.dumps({"settings": earlier}))
    with pytest.raises(ValueError, match=r"other settings \(lr: 0.0001 -> 1e-05\).*Pass another --work-dir"):
        check_demo(s)
    check_demo(replace(s, lr=1e-4, work_dir=tmp_path / "." / "out"))  # its path written otherwise: the same folder


def test_with_the_recommended_run_the_pool_holds_a_fresh_prompt_for_every_step_of_every_run(tmp_path, monkeypatch):
    """At the same rollouts a step, a run at one rollout a prompt draws 4x the prompts of the n = 4 runs: the pool
    grows to it, so verl walks it in one epoch (with the n = 4 runs' pool it would take 4, each prompt 4 times)."""
    from instruments.demo import pipeline

    monkeypatch.setattr(pipeline, "recommended_run", lambda: ("recommended: one a prompt", "reinforce_plus_plus", 1,
                                                              ()))  # fmt: skip
    s = RunSettings(work_dir=tmp_path, **DEMO_DEFAULTS)
    planned, plan = demo_plan(s, recommended=True)
    assert [run[0] for run in plan] == ["grpo", "bv_blend", "recommended: one a prompt"]
    assert (s.n_train, planned.n_train) == (16 * 16, 16 * 64) and demo_plan(s)[0] == s
    prepared = Prepared(model=tmp_path / "model", train=tmp_path / "train.parquet", val=tmp_path / "val.parquet",
                        codebook=tmp_path / "codebook.npz")
    epochs = {(settings.n_train, n): _compose(verl_overrides(settings, "reinforce_plus_plus", prepared, tmp_path / "r",
                                                             n=n, batch=64 // n)).trainer.total_epochs
              for settings in (s, planned) for n in (4, 1)}  # fmt: skip
    assert epochs == {(256, 4): 1, (256, 1): 4, (1024, 4): 1, (1024, 1): 1}


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
