"""Run a child command that owns a verl run (scripts/compare_cpu.py) so that stopping the parent stops the run cleanly.

The campaign's runners (scripts/fair_verdict.py, scripts/tune_lr.py, scripts/pretrained_settings.py) run each
comparison as a child. ``subprocess.call`` kills its child 0.25 s after a Ctrl-C, and not at all on a SIGTERM, while
the child needs seconds to stop its trainer's Ray and vLLM processes (instruments/cpu/launch.py): an interrupted
runner then left a 13-16 GiB trainer running. Here the child runs in a session of its own, so an interrupt reaches it
once, from the parent, and the parent waits for its clean-up.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator


def call_child_run(command: list[str]) -> int:
    """``subprocess.call(command)``, but an interrupt of this process (Ctrl-C, or SIGTERM) is passed to the child once,
    as SIGINT, and waited out: the interrupt is raised here once the child has stopped its run and exited."""
    with _sigterm_interrupts():
        child = subprocess.Popen(command, start_new_session=True)  # a terminal's Ctrl-C reaches it only from here
        try:
            return child.wait()
        except KeyboardInterrupt:
            child.send_signal(signal.SIGINT)
            _wait_for_clean_up(child)
            raise


def _wait_for_clean_up(child: subprocess.Popen) -> None:
    """Waits for the interrupted child, however many interrupts come meanwhile: passing on a second one would cut the
    child's clean-up short."""
    while True:
        try:
            child.wait()
            return
        except KeyboardInterrupt:
            print(f"[child run] waiting for pid {child.pid} to stop its run's processes (seconds); kill -9 {child.pid} "
                  "would leave them running", file=sys.stderr)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While the child runs: SIGTERM (a scheduler's or ``kill``'s stop) interrupts this process as Ctrl-C does.
    A handler the caller installed is left alone."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
