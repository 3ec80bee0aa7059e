"""scripts/setup_env.sh does not reinstall a venv under a live verl run started from it, nor start one on a disk
without room for it, and stops at pip's first failure.

A changed pyproject.toml made the test command set .venv up again while the pretrained-LM comparison ran from it
(2026-12-05): pip installed and removed torchaudio under the run, which was starting, and it failed to import. The
set-up is run here on a copy of the script in a scratch checkout whose venv's python is a stub that fails every call,
so no pip ever runs: a refused set-up stops before it, an allowed one gets as far as the stub's failure.

A full disk made CI's fresh venv half-install (2026-12-05): pip's "No space left on device" scrolled by and the set-up
failed later, at an import. The space check is driven here by BV_BLEND_SETUP_MIN_FREE_GIB, a need no disk meets.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from instruments.cpu.launch import RUN_ID_ENV

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "setup_env.sh"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "setup_env.sh")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")  # no stamp for it: a set-up is due
    stub = tmp_path / ".venv" / "bin" / "python"
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\necho \"stub python $*\" >&2\nexit 1\n")
    stub.chmod(0o755)
    return tmp_path


def run_set_up(checkout: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(checkout / "scripts" / "setup_env.sh")], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)  # fmt: skip


def run_with_marked_process(checkout: Path, argv0: Path, env: dict[str, str] | None = None):
    """The set-up, while a process carrying a run's marker runs with ``argv0`` as its command (a trainer started
    from that python: ``exec -a`` gives the real interpreter that name)."""
    marked_env = {**os.environ, RUN_ID_ENV: "setup-test-" + uuid.uuid4().hex}
    trainer = subprocess.Popen(["bash", "-c", f'exec -a "{argv0}" "{sys.executable}" -c "import time; time.sleep(60)"'],
                               env=marked_env)  # fmt: skip
    try:
        return run_set_up(checkout, env)
    finally:
        trainer.kill()
        trainer.wait()


def test_a_set_up_due_waits_for_the_runs_started_from_its_venv(checkout):
    done = run_with_marked_process(checkout, checkout / ".venv" / "bin" / "python")
    assert done.returncode == 1
    assert "verl runs started from it are live" in done.stderr and "BV_BLEND_SETUP_FORCE=1" in done.stderr
    assert "stub python" not in done.stdout + done.stderr and "installing" not in done.stdout  # nothing ran


@pytest.mark.parametrize("case", ["another venv's run", "forced"])
def test_a_run_of_another_venv_or_a_forced_set_up_goes_ahead(checkout, tmp_path_factory, case):
    elsewhere = tmp_path_factory.mktemp("other") / ".venv" / "bin" / "python"
    argv0 = elsewhere if case == "another venv's run" else checkout / ".venv" / "bin" / "python"
    done = run_with_marked_process(checkout, argv0, {"BV_BLEND_SETUP_FORCE": "1"} if case == "forced" else None)
    assert "installing dependencies" in done.stdout and "stub python" in done.stdout + done.stderr  # past the check
    assert "are live" not in done.stderr


@pytest.mark.parametrize("venv", ["existing", "new"])
def test_a_disk_without_room_stops_the_set_up_before_anything_is_written(checkout, venv):
    venv_path = checkout / (".venv" if venv == "existing" else "fresh_venv")
    done = run_set_up(checkout, {"BV_BLEND_VENV": str(venv_path), "BV_BLEND_SETUP_MIN_FREE_GIB": "1000000000"})
    assert done.returncode == 1
    assert "GiB free; setting" in done.stderr and "needs about 1000000000 GiB" in done.stderr
    assert "BV_BLEND_VENV" in done.stderr and "TMPDIR" in done.stderr  # names the fix
    assert "stub python" not in done.stdout + done.stderr and "installing" not in done.stdout
    assert venv_path.exists() == (venv == "existing")  # no venv made


def test_pips_failure_stops_the_set_up_with_its_name(checkout):
    done = run_set_up(checkout, {"BV_BLEND_SETUP_MIN_FREE_GIB": "0"})
    assert done.returncode == 1
    assert "stub python -m pip install" in done.stdout  # pip's own message comes through
    assert "[setup] pip could not install -U pip" in done.stderr
    assert "uninstall" not in done.stdout and "torch==2.13.0" not in done.stdout  # nothing after the failed step
