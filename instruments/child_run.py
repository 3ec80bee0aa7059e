"""Run a child command that owns a verl run (scripts/compare_cpu.py) so that stopping the parent stops the run cleanly.

The campaign's runners (scripts/fair_verdict.py, scripts/tune_lr.py, scripts/pretrained_settings.py) run each
comparison as a child. ``subprocess.call`` kills its child 0.25 s after a Ctrl-C, and not at all on a SIGTERM, while
the child needs seconds to stop its trainer's Ray and vLLM processes (instruments/cpu/launch.py): an interrupted
runner then left a 13-16 GiB trainer running. Here the child runs in a session of its own, so an interrupt reaches it
once, from the parent, and the parent waits for its clean-up.

A process started in the background by a shell without job control (``nohup ... &``, a pytest-xdist worker)
inherits SIGINT ignored, and so would its child, which then could not hear the interrupt passed on: while the child
runs, the parent hears SIGINT as Ctrl-C, and the child starts with the default (Python's KeyboardInterrupt).

A runner can also stop its child on a condition of its own (``stop_when``, polled): the child hears the same single
SIGINT, and the runner learns that it stopped as asked (:class:`StoppedAsAsked`), not that it failed.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator


class StoppedAsAsked(Exception):
    """The child was stopped because the runner's ``stop_when`` said so; it heard SIGINT once and has cleaned up."""

    def __init__(self, exit_code: int):
        super().__init__(f"the child was stopped as asked (exit {exit_code})")
        self.exit_code = exit_code


def call_child_run(command: list[str], stop_when: Callable[[], bool] | None = None, poll_s: float = 30.0) -> int:
    """``subprocess.call(command)``, but an interrupt of this process (Ctrl-C, or SIGTERM) is passed to the child once,
    as SIGINT, and waited out: the interrupt is raised here once the child has stopped its run and exited.

    ``stop_when``, asked every ``poll_s`` seconds while the child runs, stops it the same way once it returns True;
    :class:`StoppedAsAsked` is then raised, after the child's clean-up."""
    with _interrupts_heard():
        child = subprocess.Popen(command, start_new_session=True)  # a terminal's Ctrl-C reaches it only from here
        try:
            while True:
                try:
                    return child.wait(timeout=None if stop_when is None else poll_s)
                except subprocess.TimeoutExpired:
                    if stop_when():
                        child.send_signal(signal.SIGINT)
                        _wait_for_clean_up(child)
                        raise StoppedAsAsked(child.returncode) from None
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
def _interrupts_heard() -> Iterator[None]:
    """While the child runs: SIGINT raises KeyboardInterrupt here even if this process inherited it ignored (a handler
    is reset to the default in the child at exec, an ignored signal is not), and SIGTERM (a scheduler's or ``kill``'s
    stop) interrupts as Ctrl-C does. Handlers the caller installed are left alone; off the main thread, nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    installed = {}
    for signum, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, interrupt)):
        if signal.getsignal(signum) in (signal.SIG_DFL, signal.SIG_IGN):
            installed[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, previous in installed.items():
            signal.signal(signum, previous)
