"""One way for the end-to-end tests to launch verl's stock trainer on CPU: with or without a deliberate fault, and
timed from the moment the fault shows in the live log."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from instruments.cpu.launch import run_trainer

REPO = Path(__file__).resolve().parents[2]
FAIL_FAST_S = 120  # a run whose rollout engine or weight sync broke must end within this long of the fault


@dataclass(frozen=True)
class Fault:
    """A fault module of tests/e2e (imported in every verl process through VERL_USE_EXTERNAL_MODULES), the variable
    that switches it on, its setting, and the line it prints when it strikes (``None``: a silent fault)."""

    module: str
    env: str
    setting: str
    marker: str | None = None

    def environment(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        return {self.env: self.setting, "VERL_USE_EXTERNAL_MODULES": self.module, "PYTHONPATH": path}


@dataclass(frozen=True)
class Launch:
    """What one run left: its exit code, log, metrics file, run id, and the seconds from the fault's first line in
    the log to the run's end (``None`` without a fault, or when the fault never struck)."""

    rc: int
    log: Path
    metrics: Path
    run_id: str
    after_fault_s: float | None

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def launch(overrides: list[str], log: Path, metrics: Path, run_id: str, fault: Fault | None = None,
           timeout_s: float = 900, env: dict[str, str] | None = None) -> Launch:  # fmt: skip
    """Runs the trainer to its end; with ``fault``, watches the live log for the fault's marker. ``env`` adds
    variables (a run's options, e.g. instruments/cpu/budget_stop.py's rollout budget)."""
    seen: dict[str, float] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if log.is_file() and fault.marker in log.read_text(errors="replace"):
                seen["fault"] = time.monotonic()
                return
            time.sleep(0.5)

    watched = fault is not None and fault.marker is not None
    watcher = threading.Thread(target=watch, daemon=True)
    if watched:
        watcher.start()
    extra_env = {**(fault.environment() if fault is not None else {}), **(env or {})}
    rc = run_trainer(overrides, log_path=log, metrics_path=metrics, timeout_s=timeout_s, run_id=run_id,
                     extra_env=extra_env or None)  # fmt: skip
    ended = time.monotonic()
    done.set()
    if watched:
        watcher.join()
    after = ended - seen["fault"] if "fault" in seen else None
    if watched:
        print(f"{run_id}: exited {rc}, {after} s after the fault ({fault.setting})")  # pytest -rP shows it
    return Launch(rc, log, metrics, run_id, after)
