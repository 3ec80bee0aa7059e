"""What the end-to-end tests share: the session's CPU assets (tests/e2e/_assets.py), the two history runs
(tests/e2e/_history.py) and the pretrained LM's run (tests/e2e/_ntf.py), each launched once however many test
modules read it."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import pickle

import pytest

from tests.e2e._assets import CpuAssets, build_cpu_assets
from tests.e2e._history import BLEND, SPO_LEGACY, HistoryRun, run_history
from tests.e2e._launch import Launch
from tests.e2e._ntf import run_ntf


@pytest.fixture(scope="session")
def cpu_assets(tmp_path_factory: pytest.TempPathFactory) -> CpuAssets:
    """The task, warmed-up tiny model and codebook, built once per session; each worker writes its runs apart.

    Under pytest-xdist the first worker to ask builds them (about 2 min of one core on 2 AVX2 cores) and the others
    wait for it and read them: both trainer groups need them at once, at the suite's start, and each used to build its
    own. The build is seeded, so every worker reads what it would have built.
    """
    own = tmp_path_factory.mktemp("cpu_e2e")
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build_cpu_assets(own)
    shared = tmp_path_factory.getbasetemp().parent / "cpu_e2e_assets"
    built = shared / "assets.pickle"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, however the build ends
        if not built.is_file():
            shared.mkdir(exist_ok=True)
            built.write_bytes(pickle.dumps(build_cpu_assets(shared)))
    return dataclasses.replace(pickle.loads(built.read_bytes()), work=own)


def _launched_once(tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    """Under pytest-xdist, every test of a shared run must be on one worker (``--dist loadgroup`` and the modules'
    ``xdist_group`` marks): a second worker would launch the same trainer run again, which costs minutes and
    passes. Fails instead, naming the cause."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    claim = tmp_path_factory.getbasetemp().parent / f"{name}.launched_by"
    try:
        with claim.open("x") as out:
            out.write(worker)
    except FileExistsError:
        pytest.fail(f"the {name} run was launched by {claim.read_text()} already and {worker} needs it too: its tests "
                    "are split across xdist workers; run with --dist loadgroup (scripts/test.sh does) on a pytest "
                    "whose nodeids xdist can group (pyproject.toml's pin)")


@pytest.fixture(scope="session")
def bv_blend_run(cpu_assets: CpuAssets, tmp_path_factory: pytest.TempPathFactory) -> HistoryRun:
    """BV-Blend's prompt_and_cluster level with the sampler, V1 trainer; the resumed process dies mid-generation."""
    _launched_once(tmp_path_factory, BLEND.name)
    return run_history(BLEND, cpu_assets)


@pytest.fixture(scope="session")
def spo_run(cpu_assets: CpuAssets, tmp_path_factory: pytest.TempPathFactory) -> HistoryRun:
    """SPO at one rollout a prompt with the sampler, on verl's legacy trainer."""
    _launched_once(tmp_path_factory, SPO_LEGACY.name)
    return run_history(SPO_LEGACY, cpu_assets)


@pytest.fixture(scope="session")
def ntf_run(cpu_assets: CpuAssets, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    """SmolLM2 with BV-Blend at one rollout a prompt and the NTF loss; a stale rollout copy, and an engine death
    before its last sync."""
    _launched_once(tmp_path_factory, "ntf")
    return run_ntf(cpu_assets)
