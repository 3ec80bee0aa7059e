"""A run that ends once it has generated a rollout budget: a measurement's option, not a CPU adaptation.

The comparison reads every arm at the reference's final rollouts (steps x rollouts a step). An arm with DAPO's
dynamic sampling (``algorithm.filter_groups``) draws prompts beyond its batch until the batch is full, several times
its batch a step where most groups are all-wrong, so its runs would generate several budgets before their last step.
With ``BV_BLEND_CPU_STOP_AT_ROLLOUTS=N`` the run ends after the first step at whose end its generated rollouts (every
rollout generated, kept or dropped: the batch's n x prompts plus dynamic sampling's dropped and surplus groups, n
rollouts each, as instruments/run/run_logs.py ``generated_rollouts`` counts them) reach N, and verl treats that step
as its last: it saves its checkpoint there and validates there, so that the run's curve has a point at the budget.

Where it hooks (verl 0.9.1's V1 trainer, verl/trainer/ppo/v1/trainer_base.py, ``PPOTrainer.fit``): the loop computes
``is_last_step = self.global_steps >= self.total_training_steps`` at the top of each step, before the step has
generated anything, and then, after ``self.step(...)`` returns, saves where ``is_last_step or global_steps %
save_freq == 0``, validates where ``is_last_step or global_steps % test_freq == 0``, logs, and runs on while
``global_steps <= total_training_steps``. A step's generated rollouts are known only once ``self.step`` returns (its
metrics then hold the replay buffer's ``training/filter_groups/*`` counts, summed by verl's MetricsAggregator), too
late to change the local ``is_last_step``. So ``PPOTrainer.step`` is wrapped: after it returns at the step that
reaches N, the trainer's ``total_training_steps`` is set to the current step (the loop ends after it) and, where verl
saves and validates at all (``save_freq`` / ``test_freq`` > 0), both every-N settings are set to 1, which makes the
two checks that follow in the same step true, as ``is_last_step`` would have. No step follows, so nothing else reads
them. ``PPOTrainer.fit`` is wrapped only to read the budget as the run starts: a resumed run starts from the rollouts
its earlier attempts generated up to its checkpoint (``BV_BLEND_CPU_ROLLOUTS_BEFORE``, which the harness counts from
their metrics), and one that had already reached N ends before training another step.

When it stops, it writes what it did (``BV_BLEND_CPU_STOP_RECORD``, a JSON file in the run folder): the step, the
rollouts generated and N. instruments/run reads it into the run's result and resume.py treats the run as finished.
Without the variable nothing is installed and verl runs unchanged.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import wrapt

from instruments.cpu.checks import warn_changed

logger = logging.getLogger(__name__)

STOP_AT_ENV = "BV_BLEND_CPU_STOP_AT_ROLLOUTS"  # N: end after the step whose generated rollouts reach it
BEFORE_ENV = "BV_BLEND_CPU_ROLLOUTS_BEFORE"  # what a resumed run's earlier attempts generated up to its checkpoint
RECORD_ENV = "BV_BLEND_CPU_STOP_RECORD"  # where the stop is recorded (a file in the run folder)
TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"
# the groups verl's dynamic sampling generated beyond the batch, per step (its sync ReplayBuffer counts prompt groups
# under these names: tests/instruments/test_verl_replay_buffer.py)
DRAWN_BEYOND = ("training/filter_groups/evicted_samples", "training/filter_groups/discarded_surplus_samples")
_MARK = "_bv_blend_cpu_budget"
_STATE = "_bv_blend_cpu_budget_state"
# what PPOTrainer.fit must still do for the stop to work (see the module's docstring)
FIT_SHAPE = (
    "is_last_step = self.global_steps >= self.total_training_steps",
    "self.global_steps <= self.total_training_steps",
    "batch = self.step(metrics, self.timing_raw)",
    "self.global_steps % self.config.trainer.save_freq == 0",
    "self.global_steps % self.config.trainer.test_freq == 0",
)


def step_rollouts(n: int, batch: int, metrics: Mapping[str, Any]) -> float:
    """The rollouts one step generated: its batch's prompts and the groups dynamic sampling drew beyond them (none
    logged: none drawn), n rollouts each."""
    return float(n * (batch + sum(float(metrics.get(name, 0.0)) for name in DRAWN_BEYOND)))


def stop_step(per_step: Sequence[float], budget: float, before: float = 0.0, first_step: int = 1) -> int | None:
    """The step after which a run with rollout budget ``budget`` ends: the first whose cumulative generated rollouts
    (``before`` included: a resumed run's earlier steps) reach it. ``per_step`` are the rollouts of steps
    ``first_step``, ``first_step + 1``, ...; ``first_step - 1`` where ``before`` reaches it already (no step to
    train), None where no step does."""
    total = before
    if total >= budget:
        return first_step - 1
    for step, rollouts in enumerate(per_step, start=first_step):
        total += rollouts
        if total >= budget:
            return step
    return None


def budget_from_env() -> tuple[float, float, Path | None] | None:
    """(N, the rollouts before this attempt, the record's path) from the environment; None without a budget."""
    raw = os.environ.get(STOP_AT_ENV, "").strip()
    if not raw:
        return None
    try:
        budget, before = float(raw), float(os.environ.get(BEFORE_ENV, "0") or 0)
    except ValueError:
        raise ValueError(f"{STOP_AT_ENV}={raw!r} and {BEFORE_ENV} must be numbers of rollouts") from None
    if budget <= 0 or before < 0:
        raise ValueError(f"{STOP_AT_ENV}={raw!r} must be > 0 and {BEFORE_ENV} >= 0")
    record = os.environ.get(RECORD_ENV, "").strip()
    return budget, before, Path(record) if record else None


def write_record(path: Path, step: int, rollouts: float, budget: float) -> None:
    """The stop, written atomically: the step, the rollouts generated by its end, the budget."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"step": step, "rollouts": rollouts, "stop_at_rollouts": budget}))
    os.replace(tmp, path)


class _Budget:
    """One run's budget, kept on its trainer: the rollouts each step of this attempt generated."""

    def __init__(self, budget: float, before: float, record: Path | None, first_step: int) -> None:
        self.budget, self.before, self.record, self.first_step = budget, before, record, first_step
        self.per_step: list[float] = []

    @property
    def generated(self) -> float:
        return self.before + sum(self.per_step)


def _end_after_this_step(trainer: Any) -> None:
    """Makes verl treat the current step as its last: the loop ends after it, and it saves and validates where verl
    does at a last step (save_freq, test_freq > 0)."""
    from omegaconf import open_dict, read_write

    trainer.total_training_steps = trainer.global_steps
    settings = trainer.config.trainer
    with read_write(settings), open_dict(settings):
        for every in ("save_freq", "test_freq"):
            if settings.get(every) is not None and settings[every] > 0:
                settings[every] = 1


def _patch_trainer(module: ModuleType) -> None:
    trainer_cls = getattr(module, "PPOTrainer", None)
    fit, step = getattr(trainer_cls, "fit", None), getattr(trainer_cls, "step", None)
    if fit is None or step is None or not all(code in inspect.getsource(fit) for code in FIT_SHAPE):
        warn_changed("rollout budget", f"{TRAINER_MODULE}.PPOTrainer.fit no longer decides its last step as this stop "
                     "expects; the run is left to train all its steps")
        return
    if getattr(fit, _MARK, False):
        return

    @functools.wraps(fit)
    def fit_within_budget(self: Any, *args: Any, **kwargs: Any) -> Any:
        read = budget_from_env()
        if read is not None:
            budget, before, record = read
            # the loop's first step is the one after the step loaded from a checkpoint (0 on a fresh start)
            state = _Budget(budget, before, record, self.global_steps + 1)
            setattr(self, _STATE, state)
            logger.warning("bv_blend CPU: the run ends after the step whose generated rollouts reach %g (%g before "
                           "step %d)", budget, before, state.first_step)
            if stop_step([], budget, before, state.first_step) is not None:  # reached by the earlier attempts
                logger.warning("bv_blend CPU: %g rollouts were generated by step %d: nothing left to train",
                               before, self.global_steps)
                self.total_training_steps = self.global_steps
        return fit(self, *args, **kwargs)

    @functools.wraps(step)
    def step_within_budget(self: Any, metrics: dict, timing_raw: dict) -> Any:
        batch = step(self, metrics, timing_raw)
        state = getattr(self, _STATE, None)
        if state is None:
            return batch
        state.per_step.append(step_rollouts(self.config.actor_rollout_ref.rollout.n,
                                            self.config.data.train_batch_size, metrics))
        if stop_step(state.per_step, state.budget, state.before, state.first_step) is not None:  # this one
            logger.warning("bv_blend CPU: %g rollouts generated by the end of step %d, reaching the budget of %g: "
                           "this step is the last (saved and validated as verl's last)", state.generated,
                           self.global_steps, state.budget)
            if state.record is not None:
                write_record(state.record, self.global_steps, state.generated, state.budget)
            _end_after_this_step(self)
        return batch

    for wrapper in (fit_within_budget, step_within_budget):
        setattr(wrapper, _MARK, True)
    trainer_cls.fit = fit_within_budget
    trainer_cls.step = step_within_budget


def install() -> None:
    """Registers the stop on verl's trainer where the environment asks for a budget; nothing otherwise."""
    if budget_from_env() is not None:
        wrapt.register_post_import_hook(_patch_trainer, TRAINER_MODULE)
