"""Launch verl's stock trainer on CPU: ``python -m instruments.cpu.launch [hydra overrides...]``.

Runs ``python -m verl.trainer.main_ppo --config-name cpu_tiny`` (``configs/cpu_tiny.yaml``: bv_blend's config plus
what CPU needs) with the caller's overrides and the environment of :func:`instruments.cpu.cpu_env`. The trainer
runs in its own session, and every process it starts carries a marker variable; whatever it leaves behind (Ray's
raylet, GCS, workers, vLLM engine cores and workers) is stopped on exit, so a crashed or interrupted run never
leaves Ray or vLLM running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from instruments.cpu import cpu_env
from instruments.machine import describe_cpu

DEFAULT_CPU_CONFIG = "cpu_tiny"
RUN_ID_ENV = "BV_BLEND_CPU_RUN_ID"
# Start-up failures that another process on the machine causes, not the run: the text that names each in the log, and
# what happened. Only runs started side by side meet them (the test suite's); a lone run does not.
STARTUP_RACES = {
    # verl picks a free port in its driver and a worker binds it seconds later (single_controller/ray/base.py,
    # get_master_addr_port); a process starting meanwhile can take it first, and torch's TCPStore then fails
    "EADDRINUSE": "a port verl had picked was taken by another process before its worker bound it",
    # ray/_private/node.py gives the raylet a fixed 30 s to register, which 2 cores busy with other runs can miss
    "The current node timed out during startup": "Ray's raylet did not register within Ray's fixed 30 s",
}


class StartupRaceRetried(UserWarning):
    """A run failed at start-up from a race with another process on the machine and was started again."""


def startup_race(rc: int, log_text: str, steps_logged: int) -> str | None:
    """Why a run that exited ``rc`` with ``log_text``, having logged ``steps_logged`` steps, is worth starting again:
    what happened, when it failed before its first step from one of :data:`STARTUP_RACES`; else ``None``."""
    if rc in (0, 124) or steps_logged:
        return None
    return next((what for line, what in STARTUP_RACES.items() if line in log_text), None)


def trainer_command(overrides: list[str], cpu_config: str = DEFAULT_CPU_CONFIG) -> list[str]:
    """The main_ppo command line: the CPU config (``configs/<cpu_config>.yaml``, which extends ``bv_blend``), then
    ``overrides`` (last one wins)."""
    return [sys.executable, "-m", "verl.trainer.main_ppo", "--config-name", cpu_config, *overrides]


def marked_processes(proc_root: Path = Path("/proc")) -> Iterator[tuple[Path, str]]:
    """Each live process that carries a run's marker (this user's to read), with the run's id: the one reader of the
    marker, for the clean-up here and for what a run holds in memory (instruments/cpu/memory.py)."""
    prefix = f"{RUN_ID_ENV}=".encode()
    for proc in proc_root.glob("[0-9]*"):
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        run = next((entry[len(prefix):] for entry in environ.split(b"\0") if entry.startswith(prefix)), None)
        if run is not None:
            yield proc, run.decode(errors="replace")


def processes_of_run(run_id: str) -> list[int]:
    """Pids of every live process that inherited this run's marker, wherever it moved (Ray daemons call setsid)."""
    return [int(proc.name) for proc, run in marked_processes() if run == run_id and int(proc.name) != os.getpid()]


def _stop_run(pgid: int, run_id: str) -> None:
    """SIGTERM, then SIGKILL, the trainer's session and every process that carries the run's marker."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        for pid in processes_of_run(run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and processes_of_run(run_id):
            time.sleep(0.2)
        if not processes_of_run(run_id):
            return


def run_trainer(
    overrides: list[str],
    log_path: Path | None = None,
    metrics_path: Path | None = None,
    extra_env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    cpu_config: str = DEFAULT_CPU_CONFIG,
    run_id: str | None = None,
    startup_retries: int = 0,
) -> int:
    """Runs the stock trainer on CPU to completion; returns its exit code (124 on timeout).

    Every process the run started (Ray's GCS and raylet, its workers, vLLM's engine and workers) is stopped before
    this returns, whether the trainer finished, failed or timed out.

    ``log_path`` receives stdout and stderr (else they pass through); ``metrics_path`` is where verl's "file"
    logger writes one JSON line per step (VERL_FILE_LOGGER_PATH). ``extra_env`` adds variables; modules it names in
    ``VERL_USE_EXTERNAL_MODULES`` are imported next to the CPU platform. ``run_id`` marks every process of the run
    (see :func:`processes_of_run`); a fresh one is drawn when omitted.

    ``startup_retries``: how many times a run that fails before its first step from a start-up race
    (:data:`STARTUP_RACES`) is started again, each time with a :class:`StartupRaceRetried` warning; the failed
    attempt's log is kept beside ``log_path`` (``<name>.attempt1``...), which it needs.
    """
    if startup_retries and log_path is None:
        raise ValueError("startup_retries needs a log_path: the log is where a start-up race shows")

    def once() -> int:
        return _run_once(overrides, log_path, metrics_path, extra_env, timeout_s, cpu_config, run_id)

    if not startup_retries:
        return once()
    assert log_path is not None
    return retry_startup_races(once, log_path, metrics_path, startup_retries)


def retry_startup_races(run_once: Callable[[], int], log_path: Path, metrics_path: Path | None, retries: int) -> int:
    """``run_once()`` (a run that writes ``log_path`` and logs its steps to ``metrics_path``), started again up to
    ``retries`` times while it fails from a start-up race (:func:`startup_race`); the last exit code."""
    attempt = 1
    while True:
        before = _lines(metrics_path)
        rc = run_once()
        what = startup_race(rc, log_path.read_text(errors="replace"), _lines(metrics_path) - before)
        if what is None or attempt > retries:
            return rc
        kept = log_path.with_name(f"{log_path.name}.attempt{attempt}")
        log_path.replace(kept)
        attempt += 1
        warnings.warn(f"the run exited {rc} before its first step: {what}. Started it again (attempt {attempt}); "
                      f"the failed attempt's log is {kept}", StartupRaceRetried, stacklevel=2)  # fmt: skip


def _lines(path: Path | None) -> int:
    """Lines in a metrics file (verl's file logger writes one a step): 0 when there is none yet."""
    if path is None or not path.is_file():
        return 0
    with path.open("rb") as lines:
        return sum(1 for _ in lines)


def _run_once(overrides: list[str], log_path: Path | None, metrics_path: Path | None,
              extra_env: dict[str, str] | None, timeout_s: float | None, cpu_config: str, run_id: str | None) -> int:
    env = cpu_env({**os.environ, **(extra_env or {})})
    run_id = run_id or uuid.uuid4().hex
    env[RUN_ID_ENV] = run_id  # inherited by Ray, its workers and vLLM: how the clean-up finds them all
    if metrics_path is not None:
        metrics_path.parent.mkdir(parents=True, exist_ok=True)
        env["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    command = trainer_command(overrides, cpu_config)
    out = open(log_path, "w") if log_path is not None else None  # noqa: SIM115 - closed in finally
    # First line of every CPU run's log: a failure report then says which kind of CPU it came from.
    header = f"[instruments.cpu] {describe_cpu()}\n"
    if out is not None:
        out.write(header)
        out.flush()
    else:
        sys.stdout.write(header)
    with _sigterm_exits():
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                   start_new_session=True)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return 124
        finally:
            _stop_run(process.pid, run_id)
            process.wait()
            if out is not None:
                out.close()


@contextlib.contextmanager
def _sigterm_exits():
    """While a run is on: SIGTERM ends this process through Python's exit path, so the clean-up above still runs.

    Python's default SIGTERM kills the process at once, skipping ``finally`` and leaving the run's Ray and vLLM
    processes behind (they live in their own session). A handler the caller installed is left alone.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def verl_rule_score(data_source: str, response: str, ground_truth: str) -> float:
    """The reward verl's trainer gives ``response`` (its default rule scorer for ``data_source``)."""
    from verl.utils.reward_score import default_compute_score

    return float(default_compute_score(data_source, response, ground_truth))


def main(argv: list[str] | None = None) -> int:
    return run_trainer(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
