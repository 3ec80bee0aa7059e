"""What each verl run on CPU holds in memory: the summed proportional set size (PSS) of every process that carries
the run's marker (``launch.RUN_ID_ENV``: the trainer, Ray's GCS and raylet, its workers, vLLM's engine), sampled.

PSS shares each page among the processes that map it, so pages that a run's many Python processes share (torch's
and verl's libraries) count once, and the sum is what the run takes from the machine. ``scripts/run_memory.py`` is
the command that watches every run; :func:`watching` is how the demo and the comparison record each of their runs'
peak, and :func:`refuse_unless_it_fits` how the comparison declines to start a run the machine cannot hold.
docs/cpu.md reports what was measured.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from instruments.cpu.launch import marked_processes

GIB = 2**30


def _pss_bytes(proc: Path) -> int:
    for line in (proc / "smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024  # kB
    return 0


def runs_memory(proc_root: Path = Path("/proc")) -> dict[str, float]:
    """Run id -> the GiB its live processes hold now (only the processes this user may read)."""
    held: dict[str, int] = {}
    for proc, run in marked_processes(proc_root):
        try:
            held[run] = held.get(run, 0) + _pss_bytes(proc)
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return {run: size / GIB for run, size in held.items()}


def available_gib(meminfo: Path = Path("/proc/meminfo")) -> float:
    """The kernel's estimate of memory a new process can take without swapping (MemAvailable)."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / GIB
    raise ValueError(f"{meminfo} has no MemAvailable line: not a Linux kernel this measures")


@dataclass
class RunPeak:
    peak_gib: float = 0.0
    first_seen: str = ""  # UTC, HH:MM:SS
    last_seen: str = ""
    least_available_gib: float = float("inf")  # the machine's, while the run was alive
    samples: int = 0


@dataclass
class MemoryWatch:
    """Each run's peak over repeated :meth:`sample` calls (a run is known by its marker, so runs that start and end
    while it watches are each kept)."""

    runs: dict[str, RunPeak] = field(default_factory=dict)
    least_available_gib: float = float("inf")

    def sample(self, now: Callable[[], str] = lambda: time.strftime("%H:%M:%S", time.gmtime())) -> None:
        held, available, stamp = runs_memory(), available_gib(), now()
        self.least_available_gib = min(self.least_available_gib, available)
        for run, gib in held.items():
            peak = self.runs.setdefault(run, RunPeak(first_seen=stamp))
            peak.peak_gib = max(peak.peak_gib, gib)
            peak.last_seen = stamp
            peak.least_available_gib = min(peak.least_available_gib, available)
            peak.samples += 1


@contextlib.contextmanager
def watching(interval_s: float = 5.0) -> Iterator[MemoryWatch]:
    """A :class:`MemoryWatch` sampled in a background thread while the block runs: once at its start, then every
    ``interval_s`` until it ends (no sample at the end: a run's processes are gone by then).

    A machine whose memory cannot be read this way (no ``/proc``, no MemAvailable) leaves the watch empty: the
    measurement is lost, never the run it measures."""
    watch, stop = MemoryWatch(), threading.Event()

    def sample() -> bool:
        try:
            watch.sample()
        except (OSError, ValueError):
            return False
        return True

    def loop() -> None:
        while sample() and not stop.wait(interval_s):
            pass

    thread = threading.Thread(target=loop, name="memory-watch", daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        stop.set()
        thread.join()


class NotEnoughMemory(RuntimeError):
    """The machine has less memory available than a run of these settings was measured to hold."""


def refuse_unless_it_fits(need_gib: float, measured: str) -> None:
    """Raises :class:`NotEnoughMemory` when less than ``need_gib`` is available now; ``measured`` says where the need
    was measured (the run that held it). The message names the verl runs already holding memory here (two SmolLM2 runs
    do not fit in 24 GiB: the one started second would be killed for memory, perhaps an hour in); the caller adds
    what to do."""
    available = available_gib()
    if available >= need_gib:
        return
    others = runs_memory()
    holders = ("; the verl runs on this machine hold " + ", ".join(f"{gib:.1f} GiB (run marker {run[:12]})"
                                                                 for run, gib in sorted(others.items()))
               if others else "; no verl run of this launcher is live here, so something else holds it")
    raise NotEnoughMemory(
        f"{available:.1f} GiB of memory is available and a run of these settings held {need_gib:.1f} GiB "
        f"({measured}){holders}")
