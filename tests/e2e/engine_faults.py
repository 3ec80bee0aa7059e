"""Deliberate deaths of verl's vLLM engine, for the end-to-end tests.

Imported in every verl process through ``VERL_USE_EXTERNAL_MODULES`` (the e2e test adds it next to the CPU
platform); it does nothing unless ``BV_BLEND_TEST_ENGINE_FAULT`` names a fault. Each SIGKILLs vLLM's engine core
process, as the kernel's OOM killer would, from vLLM's worker process (its child):

- ``kill_mid_generation:N``: during the generation that follows the process's N-th weight sync, at the worker's
  second forward pass after it, so the step's requests are in flight;
- ``kill_before_sync:N``: when the process's N-th weight sync reaches the worker, which then dies too, before it
  connects to verl's sender: an engine that died after one generation and before the next.

Sync 1 loads the actor's weights over vLLM's dummy ones at start-up (a resumed process's: the checkpoint's); sync
s + 1 follows the process's s-th update, so its s-th generation runs after sync s.

No Python code runs in the engine core on its way out, so nothing there reports the death: whatever notices it is
vLLM's client in verl's rollout server, or nothing. Why the worker process: it is the vLLM process that certainly
imports verl (vLLM loads verl's worker extension into it, ``verl.workers.rollout.vllm_rollout.utils``), and it sees
both the weight syncs, which number the training steps, and the forward passes, which say that a generation is
under way. Test code only: the package never imports it.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import wrapt

FAULT_ENV = "BV_BLEND_TEST_ENGINE_FAULT"
FAULTS = ("kill_mid_generation", "kill_before_sync")
INJECTED_FAULT = "injected engine death (tests/e2e/engine_faults.py)"
FORWARD_PASS = 2  # the second forward pass of the step: the first has prefilled, requests are decoding
EXTENSION_MODULE = "verl.workers.rollout.vllm_rollout.utils"
WORKER_MODULE = "vllm.v1.worker.gpu_worker"  # vLLM's CPUWorker inherits execute_model from this Worker

_state = {"syncs": 0, "passes": 0}


def fault_at_sync(setting: str) -> tuple[str, int]:
    """``kill_mid_generation:N`` or ``kill_before_sync:N`` as (fault, N); a malformed setting names the forms."""
    fault, _, number = setting.partition(":")
    if fault not in FAULTS or not number.isdigit() or int(number) < 1:
        raise ValueError(f"{FAULT_ENV}={setting!r}: use one of {', '.join(f + ':N' for f in FAULTS)} (N: the sync).")
    return fault, int(number)


def _count_syncs(module: Any) -> None:
    extension = module.vLLMColocateWorkerExtension
    original = extension.update_weights_from_ipc

    def update_weights_from_ipc(self: Any, *args: Any, **kwargs: Any) -> Any:
        _state["syncs"] += 1
        _state["passes"] = 0
        if _fault == ("kill_before_sync", _state["syncs"]):
            _kill_engine_core(f"before weight sync {_state['syncs']}")
            os.kill(os.getpid(), signal.SIGKILL)  # and this worker, which would otherwise connect to verl's sender
        return original(self, *args, **kwargs)

    extension.update_weights_from_ipc = update_weights_from_ipc


def _kill_engine_core(when: str) -> None:
    parent = os.getppid()
    title = Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    if "EngineCore" not in title:  # the process tree is not the one this fault was written for: say so loudly
        raise RuntimeError(f"{INJECTED_FAULT}: the worker's parent {parent} is not vLLM's engine core: {title!r}")
    print(f"{INJECTED_FAULT}: SIGKILL to vLLM's engine core (pid {parent}) {when}", file=sys.stderr, flush=True)
    os.kill(parent, signal.SIGKILL)


def _inject(module: Any) -> None:
    worker = module.Worker
    original = worker.execute_model

    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            _fault == ("kill_mid_generation", _state["syncs"])
            and scheduler_output.total_num_scheduled_tokens
        ):
            _state["passes"] += 1
            if _state["passes"] == FORWARD_PASS:
                _kill_engine_core(f"during the generation after weight sync {_state['syncs']}")
        return original(self, scheduler_output, *args, **kwargs)

    worker.execute_model = execute_model


if os.environ.get(FAULT_ENV):
    # parsed once, here: a malformed setting fails in the first verl process, not in vLLM's worker, and the hooks
    # below compare with it at each sync and forward pass
    _fault = fault_at_sync(os.environ[FAULT_ENV])
    wrapt.register_post_import_hook(_count_syncs, EXTENSION_MODULE)
    wrapt.register_post_import_hook(_inject, WORKER_MODULE)
