"""verl's ``cpu`` platform: device "cpu", collectives on gloo, and a torch.cuda-shaped device module.

Works around verl/plugin/platform/platform_manager.py:113-117, which falls back to 'nvidia' (device "cuda") when no
accelerator is found: verl 0.9.1 ships nvidia, huawei and amd platforms only.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "cpu"


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
