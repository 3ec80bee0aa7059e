"""One way for the end-to-end tests to launch verl's stock trainer on CPU: with or without a deliberate fault, and
timed from the moment the fault shows in the live log."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from instruments.cpu.launch import run_trainer

REPO = Path(__file__).resolve().parents[2]
FAIL_FAST_S = 120  # a run whose rollout engine or weight sync broke must end within this long of the fault
# The suite starts trainers side by side on 2 cores, where two start-up races (instruments.cpu.launch.STARTUP_RACES)
# each failed a fresh clone once: a run that fails before its first step from one is started again, with a warning.
STARTUP_RETRIES = 1
# Ray parts that no check reads and that cost each run CPU and memory: the dashboard (its server and seven helper
# processes, about 0.7 GB) and the idle workers Ray starts ahead for the first driver.
LEAN_RAY_OVERRIDES = ("+ray_kwargs.ray_init.include_dashboard=false",)
LEAN_RAY_ENV = {"RAY_prestart_worker_first_driver": "0"}


def run_in_suite(overrides: Sequence[str], extra_env: dict[str, str] | None = None, **run: Any) -> int:
    """instruments.cpu.launch.run_trainer as the suite runs it: with a retry after a start-up race and a lean Ray."""
    return run_trainer([*overrides, *LEAN_RAY_OVERRIDES], extra_env={**LEAN_RAY_ENV, **(extra_env or {})},
                       startup_retries=STARTUP_RETRIES, **run)  # fmt: skip


@dataclass(frozen=True)
class Fault:
    """A fault module of tests/e2e (imported in every verl process through VERL_USE_EXTERNAL_MODULES), the variable
    that switches it on, its setting, and the line it prints when it strikes (``None``: a silent fault)."""

    module: str
    env: str
    setting: str
    marker: str | None = None


def fault_environment(faults: Sequence[Fault]) -> dict[str, str]:
    """The variables that switch ``faults`` on in every verl process of a run (none for no fault)."""
    if not faults:
        return {}
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    modules = ",".join(dict.fromkeys(fault.module for fault in faults))  # verl imports each module it names once
    return {**{fault.env: fault.setting for fault in faults}, "VERL_USE_EXTERNAL_MODULES": modules, "PYTHONPATH": path}


@dataclass(frozen=True)
class Launch:
    """What one run left: its exit code, log, metrics file, run id, and the seconds from the first line of a fault
    in the log to the run's end (``None`` without a fault that prints one, or when it never struck)."""

    rc: int
    log: Path
    metrics: Path
    run_id: str
    after_fault_s: float | None

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def launch(overrides: list[str], log: Path, metrics: Path, run_id: str, faults: Sequence[Fault] = (),
           timeout_s: float = 900, env: dict[str, str] | None = None) -> Launch:  # fmt: skip
    """Runs the trainer to its end; with ``faults``, watches the live log for their markers. ``env`` adds variables
    (a run's options, e.g. instruments/cpu/budget_stop.py's rollout budget)."""
    seen: dict[str, float] = {}
    done = threading.Event()
    markers = [fault.marker for fault in faults if fault.marker is not None]

    def watch() -> None:
        while not done.is_set():
            text = log.read_text(errors="replace") if log.is_file() else ""
            if any(marker in text for marker in markers):
                seen["fault"] = time.monotonic()
                return
            time.sleep(0.5)

    watched = bool(markers)
    watcher = threading.Thread(target=watch, daemon=True)
    if watched:
        watcher.start()
    extra_env = {**fault_environment(faults), **(env or {})}
    rc = run_in_suite(overrides, log_path=log, metrics_path=metrics, timeout_s=timeout_s, run_id=run_id,
                      extra_env=extra_env)  # fmt: skip
    ended = time.monotonic()
    done.set()
    if watched:
        watcher.join()
    after = ended - seen["fault"] if "fault" in seen else None
    if watched:
        settings = ", ".join(fault.setting for fault in faults)
        print(f"{run_id}: exited {rc}, {after} s after the fault ({settings})")  # pytest -rP shows it
    return Launch(rc, log, metrics, run_id, after)
