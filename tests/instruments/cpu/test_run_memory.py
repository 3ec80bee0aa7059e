"""The run-memory instrument (instruments/cpu/memory.py, scripts/run_memory.py) on real processes: one that carries a
run's marker and holds a known amount of memory, one that holds as much without the marker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from instruments.cpu import memory
from instruments.cpu.launch import RUN_ID_ENV
from instruments.cpu.memory import (
    MemoryWatch,
    NotEnoughMemory,
    available_gib,
    refuse_unless_it_fits,
    runs_memory,
    watching,
)
from tests._scripts import load_script

HOLD_MIB = 256
# touches every page of a buffer so that it is resident, says so, then waits to be stopped
HOLDER = (f"import sys, time; b = bytearray({HOLD_MIB} * 2**20); b[::4096] = b'x' * len(b[::4096]); "
          "print('ready', flush=True); time.sleep(300)")


@pytest.fixture
def holders():
    """A marked process and an unmarked one, each holding HOLD_MIB MiB; yields the marked one's run id."""
    run = "memory-test-" + uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != RUN_ID_ENV}
    marked = subprocess.Popen([sys.executable, "-c", HOLDER], env={**env, RUN_ID_ENV: run}, stdout=subprocess.PIPE)
    unmarked = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdout=subprocess.PIPE)
    try:
        for process in (marked, unmarked):
            assert process.stdout.readline().strip() == b"ready"
        yield run
    finally:
        for process in (marked, unmarked):
            process.kill()
            process.wait()


def test_a_runs_memory_is_its_marked_processes_and_only_theirs(holders):
    held = runs_memory()
    # the buffer, plus an interpreter's own pages (its share of the libraries it maps with other processes)
    assert HOLD_MIB / 1024 <= held[holders] < HOLD_MIB / 1024 + 0.25
    total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    assert 0 < available_gib() <= total_gib


def test_the_watch_keeps_each_runs_peak_after_the_run_ends():
    run = "memory-test-" + uuid.uuid4().hex
    process = subprocess.Popen([sys.executable, "-c", HOLDER], env={**os.environ, RUN_ID_ENV: run},
                               stdout=subprocess.PIPE)
    try:
        assert process.stdout.readline().strip() == b"ready"
        watch = MemoryWatch()
        watch.sample(now=lambda: "12:00:00")
    finally:
        process.kill()
        process.wait()
    peak = watch.runs[run]
    assert peak.peak_gib >= HOLD_MIB / 1024 and peak.first_seen == peak.last_seen == "12:00:00"
    assert peak.least_available_gib == watch.least_available_gib < float("inf")
    watch.sample(now=lambda: "12:00:05")  # the run is gone: its peak stays, as last seen
    assert run not in runs_memory() and watch.runs[run].peak_gib == peak.peak_gib
    assert (watch.runs[run].last_seen, watch.runs[run].samples) == ("12:00:00", 1)


def test_the_script_writes_what_it_saw_and_prints_the_table(holders, tmp_path, capsys):
    out = tmp_path / "peaks.json"
    assert load_script("run_memory").main(["--seconds", "1", "--interval", "0.2", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["runs"][holders]["peak_gib"] >= HOLD_MIB / 1024 and saved["cpu"].startswith("CPU: ")
    assert holders[:44] in capsys.readouterr().out
    for argv, message in ((["--interval", "0"], "--interval must be above 0"),
                          (["--out", str(tmp_path / "missing" / "p.json")], "its folder does not exist")):
        with pytest.raises(SystemExit):
            load_script("run_memory").main(argv)
        assert message in capsys.readouterr().err


def test_watching_samples_a_live_run_in_the_background_until_the_block_ends(holders):
    with watching(interval_s=0.05) as watch:
        deadline = time.monotonic() + 60  # a sample reads every process's environ: slow on a loaded machine
        while (holders not in watch.runs or watch.runs[holders].samples < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
    samples = watch.runs[holders].samples
    assert watch.runs[holders].peak_gib >= HOLD_MIB / 1024 and samples >= 2
    time.sleep(0.2)
    assert watch.runs[holders].samples == samples, "the watch went on sampling after its block"


def test_a_machine_whose_memory_cannot_be_read_loses_the_measurement_not_the_run(monkeypatch):
    def unreadable():
        raise ValueError("/proc/meminfo has no MemAvailable line")

    monkeypatch.setattr(memory, "available_gib", unreadable)
    with watching(interval_s=0.01) as watch:
        pass
    assert watch.runs == {} and watch.least_available_gib == float("inf")


def test_a_run_that_does_not_fit_is_refused_naming_the_runs_holding_memory(holders):
    refuse_unless_it_fits(0.0, "a run that held nothing")  # fits: no error
    with pytest.raises(NotEnoughMemory) as refused:
        refuse_unless_it_fits(available_gib() + 1000.0, "grpo_n8_seed0's peak")
    message = str(refused.value)
    assert "GiB of memory is available and a run of these settings held" in message
    assert "grpo_n8_seed0's peak" in message and f"run marker {holders[:12]}" in message


def test_the_script_started_in_the_background_ends_on_sigterm_with_its_table(holders, tmp_path):
    """A watch started with ``&`` from a script ignores SIGINT (bash's rule for background jobs), so ``kill`` is how it
    ends there: with its table and its JSON, exit 0."""
    out = tmp_path / "peaks.json"
    watch = subprocess.Popen([sys.executable, "scripts/run_memory.py", "--interval", "0.1", "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             cwd=Path(__file__).resolve().parents[3])
    deadline = time.monotonic() + 60
    while not (out.is_file() and holders in json.loads(out.read_text())["runs"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    watch.terminate()
    printed, _ = watch.communicate(timeout=60)
    assert watch.returncode == 0
    assert holders[:44] in printed and "the machine's least available memory while watching" in printed
