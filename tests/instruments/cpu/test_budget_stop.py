"""The rollout budget's stop (instruments/cpu/budget_stop.py): the decision, its count of a step's rollouts against
the comparison's (instruments/run/run_logs.py), and the stop in verl 0.9.1's own V1 training loop.

The loop is verl's real ``PPOTrainer.fit`` and ``PPOTrainer.step`` (with its MetricsAggregator), on verl's config as
the launcher composes it (configs/cpu_tiny.yaml), with the stop installed as a run installs it. What a step would do
on workers (generation, the update, the checkpoint, the validation) is replaced by a stand-in that records the call
and logs what verl's replay buffer logs under dynamic sampling: no trainer launch (tests/e2e's budget has none for
this), seconds once verl is imported.
"""

from __future__ import annotations

import copy
import json
import types
from pathlib import Path

import pytest

from instruments.cpu import budget_stop
from instruments.run import report, run_logs

N, BATCH = 4, 2  # rollouts a prompt, prompts a step: 8 rollouts a step before dynamic sampling's
# the prompt groups dynamic sampling drew beyond the batch, per step: (dropped all-equal, surplus)
DRAWN = {1: (2, 0), 2: (1, 0), 3: (0, 0), 4: (1, 1), 5: (0, 0), 6: (3, 0), 7: (0, 0), 8: (0, 0)}
ROLLOUTS = {step: N * (BATCH + dropped + surplus) for step, (dropped, surplus) in DRAWN.items()}  # 16 12 8 16 8 20 8 8


def _metrics(step: int) -> dict[str, float]:
    dropped, surplus = DRAWN[step]
    logged = {"training/filter_groups/evicted_samples": dropped,
              "training/filter_groups/discarded_surplus_samples": surplus}
    return {name: float(v) for name, v in logged.items() if v}  # verl logs a count only where it drew some


def test_the_stop_step_is_the_first_whose_generated_rollouts_reach_the_budget():
    per_step = [ROLLOUTS[step] for step in range(1, 9)]  # cumulative 16 28 36 52 60 80 88 96
    assert budget_stop.stop_step(per_step, 36) == 3  # reached exactly
    assert budget_stop.stop_step(per_step, 37) == 4  # passed
    assert budget_stop.stop_step(per_step, 1) == 1
    assert budget_stop.stop_step(per_step, 96) == 8 and budget_stop.stop_step(per_step, 97) is None
    # a resumed run: steps 1-2 generated 28 before its checkpoint, steps 3, 4, ... follow
    assert budget_stop.stop_step(per_step[2:], 40, before=28, first_step=3) == 4
    assert budget_stop.stop_step([], 28, before=28, first_step=3) == 2  # reached already: no step to train
    assert budget_stop.stop_step([], 29, before=28, first_step=3) is None


def test_a_steps_rollouts_are_counted_as_the_comparison_counts_them():
    """The trainer's count of each step and run_logs.generated_rollouts (what the result and the pairing read) give
    the same cumulative rollouts at every step."""
    by_step = [budget_stop.step_rollouts(N, BATCH, _metrics(step)) for step in range(1, 9)]
    assert by_step == [ROLLOUTS[step] for step in range(1, 9)]
    drawn = {"evicted_samples": {str(s): float(d) for s, (d, _) in DRAWN.items() if d},
             "discarded_surplus_samples": {str(s): float(u) for s, (_, u) in DRAWN.items() if u}}
    result = {"spec": {"n": N, "batch": BATCH}, "filter_groups": drawn}
    cumulative = [sum(by_step[:step]) for step in range(1, 9)]
    assert run_logs.generated_rollouts(result, range(1, 9)).tolist() == cumulative


def test_the_budget_is_read_from_the_environment(monkeypatch, tmp_path):
    for name in (budget_stop.STOP_AT_ENV, budget_stop.BEFORE_ENV, budget_stop.RECORD_ENV):
        monkeypatch.delenv(name, raising=False)
    assert budget_stop.budget_from_env() is None  # no budget: install() registers nothing, verl runs unchanged
    monkeypatch.setenv(budget_stop.STOP_AT_ENV, "1280")
    assert budget_stop.budget_from_env() == (1280.0, 0.0, None)
    monkeypatch.setenv(budget_stop.BEFORE_ENV, "256.0")
    monkeypatch.setenv(budget_stop.RECORD_ENV, str(tmp_path / "stopped.json"))
    assert budget_stop.budget_from_env() == (1280.0, 256.0, tmp_path / "stopped.json")
    for bad in ("0", "-5", "many"):
        monkeypatch.setenv(budget_stop.STOP_AT_ENV, bad)
        with pytest.raises(ValueError, match=budget_stop.STOP_AT_ENV):
            budget_stop.budget_from_env()


# ------------------------------------------------------------------------------------- in verl's training loop
TOTAL_STEPS, EVERY = 8, 5  # trainer.total_training_steps; save_freq and test_freq (steps 5 and 8 without a stop)


@pytest.fixture(scope="module")
def verl_trainer():
    """verl's trainer module, and the launcher's config composed by hydra (as scripts' runs compose it)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from verl.trainer.ppo.v1 import trainer_base

    from instruments.cpu.launch import DEFAULT_CPU_CONFIG

    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose(DEFAULT_CPU_CONFIG, overrides=[
            f"trainer.total_training_steps={TOTAL_STEPS}", f"trainer.save_freq={EVERY}", f"trainer.test_freq={EVERY}",
            f"data.train_batch_size={BATCH}", f"++actor_rollout_ref.rollout.n={N}",
            "algorithm.filter_groups.enable=true", "trainer.rollout_data_dir=null"])
    GlobalHydra.instance().clear()
    return trainer_base, config


def _fit(trainer_base, config, monkeypatch, tmp_path: Path, budget: int | None, resume_step: int = 0,
         before: float = 0.0) -> dict:
    """verl's real fit and step, with the stop installed; the workers' parts stand in. Returns what was trained,
    saved, validated and logged, and the settings the loop ended with."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    # the stop patches verl's class, as in a run's process; the originals come back after the test
    monkeypatch.setattr(trainer_base.PPOTrainer, "fit", trainer_base.PPOTrainer.fit)
    monkeypatch.setattr(trainer_base.PPOTrainer, "step", trainer_base.PPOTrainer.step)
    budget_stop._patch_trainer(trainer_base)
    for name in (budget_stop.STOP_AT_ENV, budget_stop.BEFORE_ENV, budget_stop.RECORD_ENV):
        monkeypatch.delenv(name, raising=False)
    if budget is not None:
        monkeypatch.setenv(budget_stop.STOP_AT_ENV, str(budget))
        monkeypatch.setenv(budget_stop.BEFORE_ENV, str(before))
        monkeypatch.setenv(budget_stop.RECORD_ENV, str(tmp_path / "stopped.json"))
    seen: dict = {"trained": [], "saved": [], "validated": [], "logged": {}}

    class Tracking:
        def __init__(self, **kwargs) -> None:
            pass

        def log(self, data: dict, step: int) -> None:
            seen["logged"][step] = dict(data)

    monkeypatch.setattr(trainer_base, "Tracking", Tracking)
    monkeypatch.setattr(trainer_base, "SkipManager", types.SimpleNamespace(init=lambda config: None,
                                                                           set_step=lambda step: None))
    monkeypatch.setattr(trainer_base, "tq", types.SimpleNamespace(kv_clear=lambda **kwargs: None))

    class StandIn(PPOTrainerSync):
        """verl's sync trainer; what runs on workers stands in."""

        def prepare_step(self) -> dict:
            return {}

        def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int):
            seen["trained"].append(self.global_steps)
            metrics.update(_metrics(self.global_steps))  # as verl's replay buffer returns them from its sample()
            keys = [f"p{self.global_steps}-{i}_{j}_0" for i in range(sample_batch_size) for j in range(N)]
            return trainer_base.KVBatchMeta(partition_id="train", keys=keys, tags=[{}] * len(keys))

        def _reissue_inflight_prompts(self, partition_id: str = "train") -> int:
            return 0

        def on_step_end(self) -> None:  # the weight sync
            pass

        def _save_checkpoint(self) -> None:
            seen["saved"].append(self.global_steps)

        def _validate(self) -> dict:
            seen["validated"].append(self.global_steps)
            return {"val-core/arith/acc/mean@1": 0.5}

        def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch) -> None:
            metrics["timing_s/step"] = 1.0

        def _shutdown_dump_executor(self) -> None:
            pass

    trainer = object.__new__(StandIn)  # verl's __init__ builds the workers' pools
    trainer.config = copy.deepcopy(config)  # the stop changes its trainer section
    trainer.global_steps = resume_step  # _load_checkpoint's
    trainer.total_training_steps = TOTAL_STEPS
    trainer.steps_per_epoch = 100
    trainer.parameter_sync_step = 1
    trainer.fit(agent_loop_manager=None)
    seen["freq"] = (trainer.config.trainer.save_freq, trainer.config.trainer.test_freq)
    seen["record"] = json.loads((tmp_path / "stopped.json").read_text()) if (tmp_path / "stopped.json").exists() \
        else None
    return seen


@pytest.mark.slow  # imports verl's trainer (~10-30 s)
def test_verls_loop_ends_after_the_step_that_reaches_the_budget_and_validates_there(verl_trainer, monkeypatch,
                                                                                     tmp_path):
    trainer_base, config = verl_trainer
    # without a budget the installed stop changes nothing: every step, saved and validated every 5 and at the last
    plain = _fit(trainer_base, config, monkeypatch, tmp_path, budget=None)
    assert plain["trained"] == list(range(1, TOTAL_STEPS + 1)) and plain["record"] is None
    assert plain["saved"] == plain["validated"] == [EVERY, TOTAL_STEPS] and plain["freq"] == (EVERY, EVERY)

    # 16 + 12 + 8 = 36 rollouts by the end of step 3: the loop ends there, saved and validated as verl's last step
    stopped = _fit(trainer_base, config, monkeypatch, tmp_path, budget=36)
    assert stopped["trained"] == [1, 2, 3] and sorted(stopped["logged"]) == [1, 2, 3]
    assert stopped["saved"] == stopped["validated"] == [3]
    assert "val-core/arith/acc/mean@1" in stopped["logged"][3]  # the curve's point at the budget
    assert stopped["record"] == {"step": 3, "rollouts": 36.0, "stop_at_rollouts": 36.0}
    # what verl logged is what the comparison reads: the same rollouts by the stop step
    logged = tmp_path / "metrics.jsonl"
    logged.write_text("".join(json.dumps({"step": step, "data": data}) + "\n"
                              for step, data in stopped["logged"].items()))
    result = {"spec": {"n": N, "batch": BATCH}, **run_logs.filter_groups_of(report.read_metrics(logged))}
    assert run_logs.generated_rollouts(result, [3]).tolist() == [36.0]


@pytest.mark.slow
def test_a_resumed_run_counts_its_earlier_rollouts_and_one_past_its_budget_trains_nothing(verl_trainer,
                                                                                          monkeypatch, tmp_path):
    trainer_base, config = verl_trainer
    # resumed from step 2's checkpoint, 28 rollouts generated by then: step 3 reaches 36, step 4 reaches 52
    resumed = _fit(trainer_base, config, monkeypatch, tmp_path, budget=40, resume_step=2, before=28.0)
    assert resumed["trained"] == [3, 4] and resumed["saved"] == resumed["validated"] == [4]
    assert resumed["record"] == {"step": 4, "rollouts": 52.0, "stop_at_rollouts": 40.0}
    # killed after logging the stop step, before its exit: resumed from that step's checkpoint, it trains nothing
    (tmp_path / "stopped.json").unlink()
    done = _fit(trainer_base, config, monkeypatch, tmp_path, budget=40, resume_step=4, before=52.0)
    assert done["trained"] == done["saved"] == done["validated"] == [] and done["logged"] == {}


PROBE = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import verl  # activates the CPU platform, as in every process of a run
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from instruments.cpu import CpuAdaptationWarning
print("RESULT" + json.dumps({"fit": getattr(PPOTrainerSync.fit, "_bv_blend_cpu_budget", False),
    "step": getattr(PPOTrainer.step, "_bv_blend_cpu_budget", False),
    "warnings": [str(w.message) for w in caught if issubclass(w.category, CpuAdaptationWarning)]}))
"""


@pytest.mark.slow  # a fresh process that imports verl (~20-40 s)
def test_the_stop_is_installed_on_verls_trainer_in_a_run_process():
    """A fresh process with the launcher's environment and a budget, as the process that runs verl's trainer: verl
    0.9.1's loop has the shape the stop relies on (no warning), and the sync trainer's fit and step are the stop's."""
    import subprocess
    import sys

    from instruments.cpu import cpu_env

    env = {**cpu_env(), budget_stop.STOP_AT_ENV: "1280"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT"))[len("RESULT"):])
    assert result == {"fit": True, "step": True, "warnings": []}


def test_without_a_budget_nothing_is_installed(monkeypatch):
    registered = []
    monkeypatch.setattr(budget_stop.wrapt, "register_post_import_hook", lambda hook, name: registered.append(name))
    monkeypatch.delenv(budget_stop.STOP_AT_ENV, raising=False)
    budget_stop.install()
    assert registered == []
    monkeypatch.setenv(budget_stop.STOP_AT_ENV, "1280")
    budget_stop.install()
    assert registered == [budget_stop.TRAINER_MODULE]


def test_a_changed_verl_loop_is_reported_and_left_alone():
    """A future verl whose fit no longer decides its last step as the stop expects: a warning, and verl's own loop."""
    from instruments.cpu.checks import CpuAdaptationWarning

    class FutureTrainer:
        def fit(self, agent_loop_manager) -> None:
            self.done = True

        def step(self, metrics, timing_raw) -> None:
            return None

    future = types.ModuleType("future_trainer_base")
    future.PPOTrainer = FutureTrainer
    fit = FutureTrainer.fit
    with pytest.warns(CpuAdaptationWarning, match="rollout budget.*PPOTrainer.fit no longer decides its last step"):
        budget_stop._patch_trainer(future)
    assert FutureTrainer.fit is fit
