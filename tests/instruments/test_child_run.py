"""instruments/child_run.py with real processes: a runner interrupted by Ctrl-C or SIGTERM waits while its child
(standing in for scripts/compare_cpu.py, whose clean-up takes seconds) stops, and the child hears the interrupt once,
whether the runner was started in a terminal or in the background (SIGINT inherited ignored).

subprocess.call, which the runners used before, killed such a child 0.25 s after a Ctrl-C, before its clean-up, and
never passed on a SIGTERM: every interrupt test here fails with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A comparison's stand-in: on an interrupt it takes a second to stop "its run", and it counts the interrupts it hears.
CHILD = """
import pathlib, sys, time
folder = pathlib.Path(sys.argv[1])
(folder / "started").touch()
try:
    time.sleep(60)
    sys.exit(1)  # never interrupted: a failed test leaves nothing behind for long
except KeyboardInterrupt:
    heard = 1
while True:
    try:
        time.sleep(1)
        (folder / "cleaned_up").write_text(str(heard))
        sys.exit(130)
    except KeyboardInterrupt:
        heard += 1
"""

# The runner: what scripts/fair_verdict.py does around each comparison.
RUNNER = """
import sys
from instruments.child_run import call_child_run
try:
    call_child_run([sys.executable, "-c", sys.argv[1], sys.argv[2]])
except KeyboardInterrupt:
    sys.exit(130)
"""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start_runner(folder: Path, sigint_ignored: bool = True) -> subprocess.Popen:
    """The runner as `nohup ... &` or a pytest-xdist worker starts it (SIGINT ignored), or as a terminal does."""
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, CHILD, str(folder)], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)},
                              preexec_fn=_ignore_sigint if sigint_ignored else None)  # fmt: skip
    deadline = time.monotonic() + 30
    while not (folder / "started").exists():
        assert time.monotonic() < deadline and runner.poll() is None, "the child never started"
        time.sleep(0.05)
    return runner


@pytest.mark.parametrize("sigint_ignored", [True, False], ids=["in_background", "in_a_terminal"])
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_an_interrupted_runner_waits_for_its_child_to_clean_up(tmp_path: Path, stop: signal.Signals,
                                                               sigint_ignored: bool) -> None:  # fmt: skip
    runner = _start_runner(tmp_path, sigint_ignored)
    runner.send_signal(stop)  # the runner alone, as `kill` or a scheduler sends it
    assert runner.wait(timeout=30) == 130
    assert (tmp_path / "cleaned_up").read_text() == "1", "the child must hear the interrupt once and finish cleaning up"


def test_a_second_ctrl_c_does_not_cut_the_clean_up_short(tmp_path: Path) -> None:
    runner = _start_runner(tmp_path)
    runner.send_signal(signal.SIGINT)
    time.sleep(0.3)
    runner.send_signal(signal.SIGINT)  # an impatient user, while the child cleans up
    assert runner.wait(timeout=30) == 130
    assert (tmp_path / "cleaned_up").read_text() == "1"


def test_a_child_that_finishes_gives_its_exit_code() -> None:
    from instruments.child_run import call_child_run

    assert call_child_run([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3


def test_a_child_stopped_on_the_runners_condition_cleans_up_and_says_so(tmp_path: Path) -> None:
    """``stop_when`` (scripts/fair_verdict.py --stop-at-checkpoint): polled while the child runs; once it holds, the
    child hears one SIGINT, cleans up, and the runner learns it stopped as asked rather than failed."""
    from instruments.child_run import StoppedAsAsked, call_child_run

    asked = []

    def stop_once_started() -> bool:
        asked.append(time.monotonic())
        return (tmp_path / "started").exists()

    with pytest.raises(StoppedAsAsked) as stopped:
        call_child_run([sys.executable, "-c", CHILD, str(tmp_path)], stop_when=stop_once_started, poll_s=0.1)
    assert stopped.value.exit_code == 130
    assert (tmp_path / "cleaned_up").read_text() == "1"
    assert len(asked) >= 1


def test_a_child_that_finishes_before_the_condition_holds_gives_its_exit_code() -> None:
    from instruments.child_run import call_child_run

    assert call_child_run([sys.executable, "-c", "import sys; sys.exit(3)"], stop_when=lambda: False, poll_s=0.1) == 3
