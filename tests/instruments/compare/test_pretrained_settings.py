"""A pretrained LM as a parameter of verl's CPU harness (issue 38): the demo's and the comparison's settings, the
overrides it composes into verl's config, and the regime's guards. The demo's own command line is tested in
tests/instruments/demo/test_pipeline.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from instruments import regime
from instruments.compare import arms as compare_arms
from instruments.compare import no_revisit
from instruments.compare import runs as compare_runs
from instruments.cpu.launch import DEFAULT_CPU_CONFIG
from instruments.demo import pipeline
from instruments.run import prepare as run_prepare
from instruments.run import run_logs
from instruments.run import settings as run_settings
from instruments.run.settings import Prepared, RunSettings
from instruments.run.verl_run import verl_overrides
from tests._scripts import load_script


def _compose(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose(DEFAULT_CPU_CONFIG, overrides=overrides)


def _prepared(tmp_path: Path) -> Prepared:
    return Prepared(model=tmp_path / "m", train=tmp_path / "t.parquet", val=tmp_path / "v.parquet",
                    codebook=tmp_path / "c.npz")


def test_a_pretrained_model_composes_its_dtype_length_bypass_and_reward(tmp_path: Path) -> None:
    s = pipeline.demo_settings(tmp_path, dtype="fp32")
    config = _compose(verl_overrides(s, "bv_blend", _prepared(tmp_path), tmp_path / "run"))
    assert config.data.max_response_length == 64 and config.actor_rollout_ref.rollout.dtype == "float32"
    assert config.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert config.algorithm.rollout_correction.bypass_mode is True
    assert config.reward.custom_reward_function.name == "compute_last_number_score"
    assert config.actor_rollout_ref.actor.optim.lr == s.lr == pipeline.comparison_lr_steps()[0]


def test_the_keys_say_which_model_and_dtype_made_a_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = RunSettings(work_dir=tmp_path, model="smollm2", dtype="fp32")
    # the keys of the committed pretrained-LM results, unchanged since the tiny model's settings left
    assert s.preparation_key() == {"val_prompts": "120", "num_clusters": "8", "n_train": str(s.n_train), "seed": "0",
                                   "model": "smollm2"}
    assert compare_runs.settings_key(s)["dtype"] == "fp32"
    monkeypatch.setattr(run_settings, "cpu_flags", lambda: {"avx512_bf16": False})
    assert RunSettings(work_dir=tmp_path, model="smollm2").compute_dtype() == "fp32"  # auto
    with pytest.raises(RuntimeError, match="without AVX-512-BF16.*one dtype for all its runs"):
        RunSettings(work_dir=tmp_path, model="smollm2", dtype="bf16").compute_dtype()
    monkeypatch.setattr(run_settings, "cpu_flags", lambda: {"avx512_bf16": True})
    # without AMX, bf16's update is the slower (scripts/bench_dtype.py): auto is fp32, an explicit bf16 runs
    assert RunSettings(work_dir=tmp_path, model="smollm2").compute_dtype() == "fp32"
    assert RunSettings(work_dir=tmp_path, model="smollm2", dtype="bf16").compute_dtype() == "bf16"
    monkeypatch.setattr(run_settings, "cpu_flags", lambda: {"avx512_bf16": True, "amx_bf16": True})
    assert RunSettings(work_dir=tmp_path, model="smollm2").compute_dtype() == "bf16"
    with pytest.raises(ValueError, match="not auto, bf16 or fp32"):
        RunSettings(work_dir=tmp_path, dtype="fp16")


def test_a_user_folder_is_checked_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json"):
        run_prepare.prepare_pretrained(RunSettings(work_dir=tmp_path, model=str(tmp_path)))


def test_the_regime_refuses_a_configuration_that_would_revisit() -> None:
    script = load_script("compare_cpu")
    base = ["--arms", "grpo:8", "reinforce_plus_plus:1", "--rollouts-per-step", "32", "--steps", "60",
            "--regime-summary", "results/regime"]
    assert script.parse_args([*base, "--task", "wide", "--distinct-train"]).pool == 60 * 32
    with pytest.raises(SystemExit):  # a pool that may repeat a problem
        script.parse_args([*base, "--task", "wide"])
    with pytest.raises(SystemExit):  # 1,000 distinct prompts, and REINFORCE++ n=1 draws 60 x 32
        script.parse_args([*base, "--task", "wide", "--distinct-train", "--train-prompts", "1000"])
    specs = compare_arms.grid([("grpo", 8), ("reinforce_plus_plus", 1)], 32, [0])
    with pytest.raises(ValueError, match=r"would be drawn again.*1920 draws"):
        no_revisit.check_regime([("grpo", 8), ("reinforce_plus_plus", 1)], specs, 60, 1000, True)
    with pytest.raises(ValueError, match="add --distinct-train"):
        no_revisit.check_regime([("grpo", 8)], specs[:1], 60, 1920, False)


def test_the_held_out_split_is_bounded_by_the_task() -> None:
    """The held-out bound is the task's: half its smallest family, per family."""
    from instruments.run.task import held_out_problems, max_held_out

    assert (max_held_out("demo"), max_held_out("wide")) == (125, 5000)  # tiny_sum's 50, echo3's 2,000 prompts
    assert len(held_out_problems(max_held_out("wide"), seed=0, task="wide")) == 5000
    with pytest.raises(ValueError, match="use at most 5000"):
        held_out_problems(5001, seed=0, task="wide")


def test_dynamic_sampling_s_draws_are_kept_per_step_with_the_result() -> None:
    import pandas as pd

    metrics = pd.DataFrame({"training/filter_groups/evicted_samples": [12.0, 16.0], "timing_s/step": [30.0, 31.0]},
                           index=pd.Index([1, 2], name="step"))
    assert run_logs.filter_groups_of(metrics) == {"filter_groups": {"evicted_samples": {"1": 12.0, "2": 16.0}}}
    assert run_logs.filter_groups_of(metrics.drop(columns="training/filter_groups/evicted_samples")) == {}


def test_the_settings_sweep_is_grpo8_alone_on_selection_seeds_and_chooses_by_the_committed_rules(tmp_path) -> None:
    sweep = load_script("pretrained_settings")
    command = sweep.sweep_command(tmp_path, 1e-5)
    a = load_script("compare_cpu").parse_args(command[2:])
    assert a.arm_sizes == [("grpo", 8)] and a.seeds == [100, 101] and a.pool == 64 * 40 and a.lr == 1e-5
    assert (a.model, a.dtype, a.task, a.distinct_train, a.test_freq) == ("smollm2", "fp32", "wide", True, 5)
    steps = list(range(0, 41, 5))
    rising = {str(s): 0.1 + 0.01 * s for s in steps}  # still improving at 40
    flat = {str(s): min(0.1 + 0.02 * s, 0.4) for s in steps}  # flat after step 15
    curves = {5e-6: [rising, rising], 1e-5: [flat, flat], 2e-5: [flat, rising]}
    chosen = sweep.choose(curves)
    assert chosen["lr"] == 5e-6 and chosen["steps"] == 40  # 0.50 beats 0.40 and 0.45; still improving at 40
    zeros = [{str(s): 0.0 for s in steps}] * 2
    assert sweep.choose({5e-6: zeros, 1e-5: [flat, flat], 2e-5: zeros})["steps"] == 40  # never improving: the max
    levels_at_20 = {str(s): min(0.1 + 0.02 * s, 0.5) for s in steps}
    chosen = sweep.choose({5e-6: zeros, 1e-5: [levels_at_20] * 2, 2e-5: zeros})
    assert chosen["lr"] == 1e-5 and chosen["steps"] == 20  # improving at 20 (step 20 over 15), flat by 40
    with pytest.raises(ValueError, match="not finished"):
        sweep.choose({5e-6: [rising]})


def test_dynamic_sampling_is_judged_at_the_rollouts_it_generated() -> None:
    import numpy as np

    result = {"spec": {"n": 8, "batch": 8}, "filter_groups": {"evicted_samples": {"1": 8.0, "2": 4.0},
                                                               "discarded_surplus_samples": {"2": 4.0}}}
    # verl counts groups of n = 8: steps 1-4 cost 64 + 64, 64 + 64, 64, 64 rollouts: at validation steps 0, 2 and 4
    # it had generated 0, 256 and 384
    assert run_logs.generated_rollouts(result, [0, 2, 4]).tolist() == [0.0, 256.0, 384.0]
    assert run_logs.generated_rollouts({"spec": {"n": 8, "batch": 8}}, [0, 4]).tolist() == [0.0, 256.0]
    reference = np.array([[0.2, 0.3, 0.4], [0.2, 0.3, 0.5]])
    x_ref = np.array([0.0, 128.0, 256.0])
    curves = np.array([[0.2, 0.5, 0.6], [0.2, 0.4, 0.6]])
    generated = np.array([[0.0, 256.0, 384.0], [0.0, 128.0, 256.0]])  # seed 0 spent twice the budget by step 2
    arm = regime.generated_arm_summary(curves, generated, reference, x_ref)
    assert arm.finals == pytest.approx([0.5, 0.6])  # read at 256 rollouts: seed 0 at its step 2, seed 1 at its end
    assert arm.difference.value == pytest.approx(((0.5 - 0.4) + (0.6 - 0.5)) / 2)
    with pytest.raises(ValueError, match="fewer rollouts"):
        regime.generated_arm_summary(curves, generated / 4, reference, x_ref)


def test_dynamic_sampling_that_drew_past_the_pool_is_refused() -> None:
    """Its dropped groups are not in the rollout dumps that count visits: the prompts it drew are counted instead."""
    result = {"spec": {"arm": "grpo_dynamic", "n": 8, "batch": 8, "seed": 0},
              "settings": {"steps": "4", "n_train": "64"},
              "filter_groups": {"evicted_samples": {"1": 20.0, "3": 10.0}, "discarded_surplus_samples": {"2": 2.0}}}
    no_revisit.check_pool_not_exhausted(result)  # 32 kept + 32 dropped = 64: the pool, not past it
    result["filter_groups"]["discarded_surplus_samples"]["4"] = 1.0
    with pytest.raises(ValueError, match=r"drew 65 prompts \(kept and dropped\) from a pool of 64"):
        no_revisit.check_pool_not_exhausted(result)
