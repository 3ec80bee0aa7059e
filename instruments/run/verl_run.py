"""One run of verl's stock trainer on CPU for the demo and the comparison: its hydra overrides on top of
configs/cpu_tiny.yaml (the same for every method but the estimator), the run itself (instruments.cpu.launch), and the
steps it has logged, followed while it runs. instruments/run/prepare.py prepares what a run reads."""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from bv_blend.core.jsonl import jsonl_lines
from instruments.run import reward as demo_reward
from instruments.run.settings import Prepared, RunSettings

if TYPE_CHECKING:  # instruments.cpu.memory is imported where a run starts (_run_verl), as the launcher is
    from instruments.cpu.memory import MemoryWatch

GROUPS_FILE = "groups.jsonl"  # the group record (bv_blend/verl/group_record.py), kept with the run's result
MEMORY_FILE = "memory.json"  # a run's peak memory, written after each attempt (instruments/cpu/memory.py)
# where a run that ended at its rollout budget records it (RunSettings.stop_at_rollouts; instruments/cpu/budget_stop.py
# writes it from inside the trainer: the step, the rollouts generated and the budget)
STOP_FILE = "stopped.json"
MEMORY_SAMPLE_S = 5.0  # a SmolLM2 run's memory climbs over minutes; a sample costs a read of /proc per process

# the CPU platform's deadline on each weight bucket's acknowledgement (instruments/cpu/rollout_patches.py, 60 s by
# default): a pretrained model's fp32 bucket on a loaded 2-core machine missed it (the settings sweep's first fp32
# run, 2026-12-03, step 2, load average ~27), so its runs wait longer unless the user set the variable
PRETRAINED_SYNC_TIMEOUT_S = 600.0


def model_overrides(s: RunSettings, rollouts_per_step: int | None = None) -> list[str]:
    """What a pretrained model changes in cpu_tiny.yaml (sized for the tiny test fixture): its response length, one
    dtype for the actor's compute and the rollout, the rollout's log-probs as the old ones, micro-batches of up to 16
    (that divide the step's rollouts, as verl requires)."""
    bf16 = s.compute_dtype() == "bf16"
    micro = math.gcd(16, rollouts_per_step or s.batch * s.n)
    return [
        f"data.max_response_length={s.response_length}",
        f"actor_rollout_ref.rollout.dtype={'bfloat16' if bf16 else 'float32'}",
        f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={'bf16' if bf16 else 'fp32'}",
        # on-policy with one update a step, verl's bypass mode takes the rollout's log-probs as the old policy's:
        # it saves the actor's recomputation, a quarter of a step (shared/reference/smollm2_on_verl_cpu.md)
        "algorithm.rollout_correction.bypass_mode=true",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
    ]


def verl_overrides(s: RunSettings, method: str, prepared: Prepared, run_dir: Path, *, n: int | None = None,
                   batch: int | None = None, steps: int | None = None, seed: int | None = None,
                   val_before_train: bool = True, extra: Sequence[str] = (), checkpoint_every: int = 0,
                   resume_from: Path | None = None) -> list[str]:
    """The per-run hydra overrides on top of configs/cpu_tiny.yaml; identical between methods but the estimator.

    ``n``, ``batch``, ``steps`` and ``seed`` default to the settings' (scripts/compare_cpu.py varies them);
    ``val_before_train=False`` skips verl's step-0 validation (the demo's second run, which shares the first's).
    ``checkpoint_every`` > 0 saves verl's checkpoint (with the estimators' histories) every that many steps and at
    the last, into the run folder; ``resume_from`` resumes from that ``global_step_N`` folder (instruments.run.resume:
    the comparison's interrupted runs), else the run starts from scratch.
    ``extra`` are an arm's own overrides (scripts/compare_cpu.py's arms: a history level, the prompt sampler); one
    that sets a key set here is refused, since two values for one key would leave it to hydra which one wins.
    """
    n, batch = n or s.n, batch or s.batch
    steps = steps or s.steps
    seed = s.seed if seed is None else seed
    if s.n_train < batch:
        raise ValueError(f"{s.n_train} training rows cannot fill a batch of {batch} prompts")
    # verl stops after trainer.total_epochs passes over the training rows even when total_training_steps is larger:
    # a pool smaller than steps x batch (prompts that come back, for a per-prompt history) needs several epochs;
    # verl's loader drops the last incomplete batch of each epoch
    epochs = math.ceil(steps / (s.n_train // batch))
    base = [
        f"algorithm.adv_estimator={method}",
        f"algorithm.bv_blend.codebook_path={prepared.codebook}",
        f"actor_rollout_ref.model.path={prepared.model}",
        f"data.train_files={prepared.train}",
        f"data.val_files={prepared.val}",
        f"data.train_batch_size={batch}",
        f"data.seed={seed}",  # the order of training prompts
        f"actor_rollout_ref.rollout.seed={seed}",  # vLLM's sampling seed
        f"actor_rollout_ref.actor.optim.lr={s.lr}",
        f"++actor_rollout_ref.actor.ppo_mini_batch_size={batch}",  # one optimizer step per RL step: on-policy
        f"++actor_rollout_ref.rollout.n={n}",
        # validation: verl's own loop, on the held-out prompts, sampled like the training rollouts (T=1)
        f"trainer.val_before_train={str(val_before_train).lower()}",
        f"trainer.test_freq={s.test_freq}",
        f"actor_rollout_ref.rollout.val_kwargs.n={s.val_samples}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        *demo_reward.verl_overrides(last_number_answers=True),
        *model_overrides(s, n * batch),
        f"trainer.total_training_steps={steps}",
        f"trainer.experiment_name={method}",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        f"trainer.rollout_data_dir={run_dir / 'rollouts'}",
        f"bv_blend.group_record={run_dir / GROUPS_FILE}",  # every group's rewards and advantages, each step
        f"trainer.validation_data_dir={run_dir / 'validation'}",
        f"trainer.total_epochs={epochs}",
        f"trainer.save_freq={checkpoint_every if checkpoint_every > 0 else -1}",
        "trainer.max_actor_ckpt_to_keep=2",  # the latest may be unusable (saved, its step never logged)
        *(("trainer.resume_mode=resume_path", f"trainer.resume_from_path={resume_from}") if resume_from
          else ("trainer.resume_mode=disable",)),
    ]
    keys = {_override_key(o) for o in base}
    clashes = [o for o in extra if _override_key(o) in keys]
    if clashes:
        raise ValueError(f"the overrides {clashes} set keys the demo sets for every run: change RunSettings or the "
                         "run's arguments instead")
    return [*base, *extra]


def _override_key(override: str) -> str:
    """The config key of a hydra override (``++a.b=1`` -> ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


def follow_steps(metrics_path: Path, on_step: Callable[[int], None], stop: threading.Event,
                 poll_s: float = 3.0) -> None:
    """Calls ``on_step`` with the last training step verl has logged, each time it grows, until ``stop`` is set."""
    last = 0
    while not stop.wait(poll_s):
        try:
            lines = jsonl_lines(metrics_path)
        except OSError:
            continue
        steps = []
        for line in lines:
            try:
                steps.append(int(json.loads(line)["step"]))
            except (ValueError, KeyError):  # a line verl is still writing
                continue
        step = max(steps, default=0)
        if step > last:
            last = step
            on_step(step)


def run_env(s: RunSettings) -> dict[str, str]:
    """Environment a run adds: a pretrained model's longer weight-sync deadline, unless the user set one."""
    from instruments.cpu.rollout_patches import SYNC_TIMEOUT_ENV

    if SYNC_TIMEOUT_ENV in os.environ:
        return {}
    return {SYNC_TIMEOUT_ENV: str(PRETRAINED_SYNC_TIMEOUT_S)}


def budget_env(s: RunSettings, run_dir: Path, rollouts_before: float = 0.0) -> dict[str, str]:
    """Environment that ends the run at its rollout budget (``s.stop_at_rollouts``; nothing without one): the budget,
    what a resumed run's earlier attempts generated up to its checkpoint, and where the stop is recorded."""
    if s.stop_at_rollouts is None:
        return {}
    from instruments.cpu.budget_stop import BEFORE_ENV, RECORD_ENV, STOP_AT_ENV

    return {STOP_AT_ENV: str(s.stop_at_rollouts), BEFORE_ENV: repr(float(rollouts_before)),
            RECORD_ENV: str(run_dir / STOP_FILE)}


def _run_verl(s: RunSettings, label: str, overrides: list[str], run_dir: Path,
              on_step: Callable[[int], None] | None = None, empty_first: bool = True,
              rollouts_before: float = 0.0) -> Path:
    """One verl run into ``run_dir`` (log, metrics JSONL, dumps), emptied first (dumps of an earlier, longer run
    would otherwise be read as this run's) unless the caller has prepared it (the comparison: an empty folder, or one
    instruments.run.resume has set back to its checkpoint). Raises if the run fails. The run stays in this thread, so
    that an interrupt reaches run_trainer, which then stops every process of the run; ``on_step`` is fed from
    another. ``rollouts_before``: what a resumed run generated up to its checkpoint (:func:`budget_env`)."""
    from instruments.cpu.launch import run_trainer
    from instruments.cpu.memory import watching

    if run_dir.exists() and empty_first:
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    log, metrics = run_dir / "verl.log", run_dir / "metrics.jsonl"
    stop = threading.Event()
    follower = None
    if on_step is not None:
        follower = threading.Thread(target=follow_steps, args=(metrics, on_step, stop), daemon=True)
        follower.start()
    run_id = uuid.uuid4().hex
    try:
        with watching(MEMORY_SAMPLE_S) as watch:
            rc = run_trainer(overrides, log_path=log, metrics_path=metrics, timeout_s=s.run_timeout_s(),
                             extra_env={**run_env(s), **budget_env(s, run_dir, rollouts_before)}, run_id=run_id)
    finally:
        stop.set()
        if follower is not None:
            follower.join()
    held = write_memory(run_dir, watch, run_id)
    tqdm.write(f"[demo] {label}: verl exited {rc} after {time.time() - started:.0f} s{held} (log: {log})")
    if rc != 0:
        raise RuntimeError(f"verl's trainer failed for {label} (exit {rc}); the end of {log} says why")
    return run_dir


def write_memory(run_dir: Path, watch: MemoryWatch, run_id: str) -> str:
    """Writes what the run held at most (``memory.json``: its peak and the machine's least available memory while it
    ran, GiB) for the attempt's record (instruments/run/resume.py); returns it as words for the log line."""
    peak = watch.runs.get(run_id)
    if peak is None:  # memory could not be read here (instruments/cpu/memory.py), or the run died at once
        return ""
    (run_dir / MEMORY_FILE).write_text(json.dumps({"peak_memory_gib": round(peak.peak_gib, 3),
                                                   "least_available_gib": round(peak.least_available_gib, 3)}))
    return f", holding at most {peak.peak_gib:.1f} GiB"


def run_method(s: RunSettings, method: str, prepared: Prepared, run_dir: Path, *, own_start: bool = True,
               on_step: Callable[[int], None] | None = None, empty_first: bool = True, rollouts_before: float = 0.0,
               **run: Any) -> Path:
    """One training run of ``method`` into ``run_dir``; raises if it fails. ``run``: :func:`verl_overrides`' keywords;
    ``rollouts_before``: a resumed run's rollouts up to its checkpoint, where it has a rollout budget.

    ``own_start=False`` skips verl's validation before training: the demo's second run is measured from the first
    run's step-0 validation (the shared start). scripts/compare_cpu.py keeps each run's own.
    """
    overrides = verl_overrides(s, method, prepared, run_dir, val_before_train=own_start, **run)
    return _run_verl(s, method, overrides, run_dir, on_step, empty_first=empty_first, rollouts_before=rollouts_before)
