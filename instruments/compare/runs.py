"""The multi-seed comparison's runs behind scripts/compare_cpu.py: each run of the grid (instruments/compare/arms.py)
on verl's stock trainer on CPU (instruments/run), validated on the held-out prompts, read, and kept as a small
``result.json``; the comparison's readers (report.py, no_revisit.py, mechanisms.py) read those results.

A seed sets the order of training prompts (or the sampler's draws) and vLLM's sampling; every run of a comparison
shares one task, training pool, model and codebook (prepared once, in ``<out>/prepared``), so the runs of one seed
differ only by their arm, and every arm is compared with a reference arm paired by seed.

Resuming: a run is done when its ``result.json`` exists (written atomically after the run has finished and been
read); a restarted comparison skips done runs. Each run saves verl's checkpoint at every validation step, and a run
that was interrupted resumes from its latest usable one (instruments/run/resume.py: a SmolLM2 run is about an hour);
one without a checkpoint restarts from scratch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from instruments.compare.arms import RunSpec, run_overrides
from instruments.machine import describe_cpu
from instruments.provenance import code_commit
from instruments.run import report, resume
from instruments.run.run_logs import (
    SIGNAL_DEFINED,
    extra_summary,
    filter_groups_of,
    generated_rollouts,
    visits_per_prompt,
)
from instruments.run.settings import Prepared, RunSettings
from instruments.run.verl_run import follow_steps, run_method
from instruments.strict_json import finite_or, strict_dumps

RESULT_FILE = "result.json"
REPLACED_FILE = "replaced.json"  # the attempts a fresh start replaced (they left no usable checkpoint)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def settings_key(s: RunSettings) -> dict[str, str]:
    """What a result depends on besides its RunSpec: a restart must use the same, or its results would mix. The
    training pool's size is the preparation's ``n_train``. A rollout budget joins the key only where there is one, so
    that the results made before it existed keep their key, and runs with and without a stop never mix."""
    keys = ("steps", "lr", "val_samples", "test_freq")
    budget = {} if s.stop_at_rollouts is None else {"stop_at_rollouts": str(s.stop_at_rollouts)}
    return {**s.preparation_key(), **{k: str(getattr(s, k)) for k in keys}, **budget, **s.run_key()}


# ------------------------------------------------------------------------------------------------ bookkeeping
def run_dir(out: Path, spec: RunSpec) -> Path:
    return out / "runs" / spec.name


def load_result(out: Path, spec: RunSpec, key: dict[str, str]) -> dict | None:
    """The saved result of a finished run, or None when the run has not finished.

    Raises if the result was made with other settings or another definition of its arm: mixing them would make the
    comparison meaningless.
    """
    path = run_dir(out, spec) / RESULT_FILE
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    if result["settings"] != key or result["spec"] != spec.describe():
        raise ValueError(f"{path} was made with other settings ({result['settings']}, {result['spec']}); "
                         f"now {key}, {spec.describe()}. Use another --out folder, or the command that made it.")
    # a strict file writes a figure that is not finite as null (a signal ratio where no group had a signal)
    if "summary" in result:
        result["summary"] = {name: finite_or(value, math.nan) for name, value in result["summary"].items()}
    return result


def pending(out: Path, specs: Sequence[RunSpec], key: dict[str, str]) -> list[RunSpec]:
    """The runs without a saved result, in order."""
    return [spec for spec in specs if load_result(out, spec, key) is None]


def memory_needed(out: Path, specs: Sequence[RunSpec], key: dict[str, str]) -> tuple[float, str] | None:
    """The most memory a finished run of this comparison held (GiB), and which run: what its next run needs (every
    run has the same settings and rollouts a step); None before any run recorded it (results made before
    ``peak_memory_gib`` was recorded have none)."""
    held = [(result["peak_memory_gib"], spec.name) for spec in specs
            if (result := load_result(out, spec, key)) is not None and "peak_memory_gib" in result]
    return max(held) if held else None


def save_result(out: Path, spec: RunSpec, result: dict) -> Path:
    """Writes result.json atomically: a run interrupted while saving is not taken for finished."""
    path = run_dir(out, spec) / RESULT_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(strict_dumps(result))
    os.replace(tmp, path)
    return path


def fresh_run_dir(out: Path, spec: RunSpec) -> Path:
    """An empty folder for a run: what an interrupted attempt left there is removed (the run restarts)."""
    path = run_dir(out, spec)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def resumable_run_dir(out: Path, spec: RunSpec) -> tuple[Path, Path | None]:
    """The run's folder and the checkpoint to resume from: an interrupted attempt's latest usable checkpoint (its
    folder set back to it), or none (an empty folder: the run starts from scratch)."""
    path = run_dir(out, spec)
    step = resume.resume_step(path) if path.is_dir() else None
    if step is None:
        replaced = replaced_attempts(path)
        if (last := resume.replaced_attempt(path)) is not None:
            replaced.append(last)
        fresh_run_dir(out, spec)
        if replaced:  # a result says which attempts it replaced, and how far they had come
            (path / REPLACED_FILE).write_text(strict_dumps(replaced))
        resume.start_attempt(path, None)
        return path, None
    resume.prepare_resume(path, step)
    resume.start_attempt(path, step)
    return path, path / resume.CHECKPOINTS / f"global_step_{step}"


def replaced_attempts(folder: Path) -> list[dict]:
    path = folder / REPLACED_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def verl_ended_utc(attempts: Sequence[dict]) -> str:
    """When verl's last attempt ended (a run read again after a reader's failure ended then, not at its reading)."""
    last = attempts[-1]
    return datetime.fromtimestamp(last["started_unix"] + last["wall_s"], timezone.utc).isoformat(timespec="seconds")


def result_of(spec: RunSpec, key: dict[str, str], record: report.RunRecord, wall_s: float,
              rollout_dir: Path | None = None, resumed_from: Sequence[int] = ()) -> dict:
    """What the tables and plots need from one run, small enough to keep forever."""
    summary = record.summary()
    summary["all-equal %"] = summary["all-right %"] + summary["all-wrong %"]
    visits = {}
    if rollout_dir is not None:
        summary |= extra_summary(record.metrics, rollout_dir, resumed_from)
        visits = {"visits": visits_per_prompt(rollout_dir)}
    return {
        "spec": spec.describe(),
        "settings": key,
        "validation": {str(step): float(v) for step, v in record.validation[report.OVERALL].items()},
        "families_after": {f: float(v) for f, v in record.validation.loc[record.last_val].items()},
        "signal": {str(step): float(v) for step, v in record.signal.items()},
        "summary": summary,
        "wall_s": wall_s,
        "cpu": describe_cpu(),  # a comparison that resumes on another machine has runs from several kinds of CPU
        **visits,
        **filter_groups_of(record.metrics),
    }


def commit_record(attempts: Sequence[dict]) -> dict:
    """The commit the run ran, read at its first attempt's start, and whether every attempt started from a clean tree.
    Attempts recorded before the start was read have none: the commit is then read now, and marked so."""
    if "commit" in attempts[0]:
        return {"commit": attempts[0]["commit"], "tree_clean": all(a.get("tree_clean", False) for a in attempts)}
    return {"commit": code_commit(), "commit_read": "after the run"}


def rollouts_before(folder: Path, spec: RunSpec, step: int) -> float:
    """The rollouts a run's earlier attempts generated up to ``step``, the checkpoint it resumes from (every step
    generated, kept or dropped, as its result counts them: run_logs.generated_rollouts), read from their metrics."""
    if step < 1:
        return 0.0
    result = {"spec": spec.describe(), **filter_groups_of(report.read_run_metrics(folder))}
    return float(generated_rollouts(result, [step])[0])


def stopped_record(folder: Path, s: RunSettings, result: dict, metrics: pd.DataFrame) -> dict:
    """Why a run ended before its last step: its rollout budget (``stopped.json``, written inside the trainer), held
    to the budget of these settings, to the last step it logged and to the result's own count of the rollouts it
    generated by then; nothing for a run that trained all its steps."""
    stopped = resume.stopped_at(folder)
    if stopped is None:
        return {}
    if s.stop_at_rollouts is None or float(stopped["stop_at_rollouts"]) != s.stop_at_rollouts:
        raise ValueError(f"{folder} stopped at a budget of {stopped['stop_at_rollouts']} rollouts; these settings' is "
                         f"{s.stop_at_rollouts}")
    step, rollouts = int(stopped["step"]), float(stopped["rollouts"])
    counted = float(generated_rollouts(result, [step])[0])
    last_logged = int(report.training_steps(metrics).index.max())
    if step != last_logged or counted != rollouts or rollouts < s.stop_at_rollouts:
        raise ValueError(f"{folder}: the trainer stopped after step {step} with {rollouts:g} rollouts generated; its "
                         f"metrics end at step {last_logged} and count {counted:g} rollouts by step {step} (budget "
                         f"{s.stop_at_rollouts})")
    return {"stopped": {"reason": "rollout budget", "step": step, "rollouts": rollouts,
                        "stop_at_rollouts": s.stop_at_rollouts, "steps": s.steps}}


def drawn_record(result: dict, steps: int) -> dict:
    """Dynamic sampling's draws (a run with ``filter_groups`` logged): every prompt it generated rollouts for, kept
    or dropped, and every rollout; nothing for other runs."""
    if "filter_groups" not in result:
        return {}
    rollouts = float(generated_rollouts(result, [steps])[0])
    return {"drawn": {"prompts": rollouts / result["spec"]["n"], "rollouts": rollouts}}


# ---------------------------------------------------------------------------------------------------- running
def run_verl(s: RunSettings, prepared: Prepared, out: Path, spec: RunSpec,
             on_step: Callable[[int], None]) -> list[dict]:
    """Runs verl for one spec, from scratch or from an interrupted attempt's checkpoint, in this thread (so that an
    interrupt reaches run_trainer, which then stops every process of the run); returns its attempts."""
    folder, resume_from = resumable_run_dir(out, spec)
    # a resumed run with a rollout budget starts from what its earlier attempts generated up to its checkpoint
    budget = {} if s.stop_at_rollouts is None or resume_from is None else {
        "rollouts_before": rollouts_before(folder, spec, resume.resume_step(folder))}
    stop = threading.Event()
    follower = threading.Thread(target=follow_steps, args=(folder / "metrics.jsonl", on_step, stop), daemon=True)
    follower.start()
    try:
        # a resumed run's start was validated by its first attempt
        run_method(s, spec.estimator, prepared, folder, own_start=resume_from is None, empty_first=False, n=spec.n,
                   batch=spec.batch, seed=spec.seed, extra=run_overrides(spec, prepared.priors),
                   checkpoint_every=s.test_freq, resume_from=resume_from, **budget)
    finally:
        stop.set()
        follower.join()
    return resume.finish_attempt(folder)


def run_one(s: RunSettings, prepared: Prepared, out: Path, spec: RunSpec, key: dict[str, str],
            on_step: Callable[[int], None] = lambda step: None) -> dict:
    """Runs one spec (from scratch, or from an interrupted attempt's checkpoint; not at all when verl finished it and
    only its reading failed), reads it, saves and returns its result."""
    folder = run_dir(out, spec)
    if resume.completed(folder, s.steps):  # verl finished it (all its steps, or up to its budget); only reading failed
        attempts = resume.read_attempts(folder)
        on_step(resume.last_step(folder, s.steps))
    else:
        attempts = run_verl(s, prepared, out, spec, on_step)
    record = report.read_run(spec.estimator, folder, prepared.question_family, in_format=s.in_format)
    if spec.estimator not in SIGNAL_DEFINED:
        record = replace(record, signal=pd.Series(dtype=float))
    resumed_from = [a["from_step"] for a in attempts[1:]]
    result = result_of(spec, key, record, sum(a["wall_s"] for a in attempts), folder / "rollouts", resumed_from)
    # a run stopped at its rollout budget is read up to the step it stopped at
    result |= drawn_record(result, resume.last_step(folder, s.steps))
    result |= stopped_record(folder, s, result, record.metrics)
    # when, and from which code, read as each attempt started: a comparison spans sessions, machines and commits
    result |= {"started_utc": attempts[0]["started_utc"], "ended_utc": verl_ended_utc(attempts),
               **commit_record(attempts)}
    if replaced := replaced_attempts(folder):
        result["replaced_attempts"] = replaced
    peaks = [a["peak_memory_gib"] for a in attempts if "peak_memory_gib" in a]
    if peaks:  # what the next run of these settings needs (memory_needed), and what the docs quote
        result["peak_memory_gib"] = max(peaks)
    if resumed_from:
        result["resumed_from_steps"] = resumed_from
        result["attempt_cpus"] = [a.get("cpu", "unknown") for a in attempts]
        result["attempt_commits"] = [a.get("commit", "unknown") for a in attempts]
        # each attempt's own start and clean tree: the first's alone would hide a resumed attempt's dirty tree
        result["attempt_started_utc"] = [a.get("started_utc") for a in attempts]
        result["attempt_tree_clean"] = [a.get("tree_clean") for a in attempts]
    if spec.reads_priors:  # which file it read: the preparation's priors, made once (their hash ties them)
        result["priors_sha256"] = file_sha256(prepared.priors)
    save_result(out, spec, result)
    resume.drop_checkpoints(folder)
    return result
