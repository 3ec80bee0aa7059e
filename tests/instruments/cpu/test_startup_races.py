"""A run that fails at start-up from a race with another process on the machine is started again, and nothing else is.

The two races are the ones the suite's side-by-side trainer runs met (results/journal.md, "The test budget by kind of
CPU"); their texts are read from the real libraries here, so a reworded message fails a test instead of silently
ending the retries. The retry loop runs with a stand-in for the trainer: what is under test is which failures it
starts again, not verl's start-up.
"""

from __future__ import annotations

import datetime
import inspect
import socket
import warnings
from pathlib import Path

import pytest
import ray._private.node
import torch.distributed as dist

from instruments.cpu.launch import STARTUP_RACES, StartupRaceRetried, retry_startup_races, run_trainer, startup_race

RAY_LINE = "The current node timed out during startup"
RAY_TIMEOUT = f"Exception: {RAY_LINE}. This could happen because some of the raylet failed to startup ..."


def _torch_port_taken() -> str:
    """torch's own error when a process group's store cannot listen on its port, as a worker of verl's meets it."""
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(dist.DistNetworkError) as error:
            dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=5))
    return str(error.value)


def test_each_race_is_named_by_the_text_its_library_writes() -> None:
    assert startup_race(1, _torch_port_taken(), 0) == STARTUP_RACES["EADDRINUSE"]
    assert RAY_LINE in inspect.getsource(ray._private.node)  # Ray's fixed 30 s wait raises with it
    assert startup_race(1, RAY_TIMEOUT, 0) == STARTUP_RACES[RAY_LINE]


@pytest.mark.parametrize(
    ("rc", "text", "steps"),
    [
        (0, "EADDRINUSE", 0),  # a run that ended well is never run again
        (124, "EADDRINUSE", 0),  # nor one that ran out of time
        (1, "EADDRINUSE", 2),  # nor one that had trained: a second attempt would not be the same run
        (1, "RuntimeError: vLLM engine died during generation", 0),  # nor any other failure
    ],
)
def test_no_other_failure_is_called_a_race(rc: int, text: str, steps: int) -> None:
    assert startup_race(rc, text, steps) is None


class StandIn:
    """A trainer that, on each call, writes the next (exit code, log text, steps logged) of its script."""

    def __init__(self, log: Path, metrics: Path, script: list[tuple[int, str, int]]) -> None:
        self.log, self.metrics, self.script, self.calls = log, metrics, list(script), 0

    def __call__(self) -> int:
        rc, text, steps = self.script[self.calls]
        self.calls += 1
        self.log.write_text(text)
        with self.metrics.open("a") as out:
            out.writelines("{}\n" for _ in range(steps))
        return rc


def test_a_run_that_met_a_race_is_started_again_and_the_first_log_is_kept(tmp_path: Path) -> None:
    log, metrics = tmp_path / "run.log", tmp_path / "run.jsonl"
    run = StandIn(log, metrics, [(1, "... name: EADDRINUSE, message: address already in use", 0), (0, "trained", 3)])
    with pytest.warns(StartupRaceRetried, match="taken by another process.*attempt 2.*run.log.attempt1"):
        assert retry_startup_races(run, log, metrics, retries=1) == 0
    assert run.calls == 2
    assert log.read_text() == "trained" and "EADDRINUSE" in (tmp_path / "run.log.attempt1").read_text()


def test_the_retries_stop_at_their_number_with_the_last_exit_code(tmp_path: Path) -> None:
    log, metrics = tmp_path / "run.log", tmp_path / "run.jsonl"
    run = StandIn(log, metrics, [(1, RAY_TIMEOUT, 0), (2, RAY_TIMEOUT, 0), (0, "", 1)])
    with pytest.warns(StartupRaceRetried) as warned:
        assert retry_startup_races(run, log, metrics, retries=1) == 2
    assert run.calls == 2 and len(warned) == 1


def test_a_resumed_run_counts_only_the_steps_of_its_own_attempt(tmp_path: Path) -> None:
    """A metrics file that an earlier process filled does not make a start-up race look like a trained run."""
    log, metrics = tmp_path / "run.log", tmp_path / "run.jsonl"
    metrics.write_text("{}\n{}\n")
    run = StandIn(log, metrics, [(1, RAY_TIMEOUT, 0), (0, "trained", 1)])
    with pytest.warns(StartupRaceRetried):
        assert retry_startup_races(run, log, metrics, retries=1) == 0


@pytest.mark.parametrize("script", [[(1, "KeyError: 'bv_blend'", 0)], [(1, "EADDRINUSE", 1)], [(0, "EADDRINUSE", 4)]])
def test_any_other_end_is_returned_as_it_is(tmp_path: Path, script: list[tuple[int, str, int]]) -> None:
    log, metrics = tmp_path / "run.log", tmp_path / "run.jsonl"
    run = StandIn(log, metrics, script)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StartupRaceRetried)
        assert retry_startup_races(run, log, metrics, retries=3) == script[0][0]
    assert run.calls == 1 and not list(tmp_path.glob("*.attempt*"))


def test_retries_without_a_log_are_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="startup_retries needs a log_path"):
        run_trainer(["trainer.total_training_steps=1"], startup_retries=1)
