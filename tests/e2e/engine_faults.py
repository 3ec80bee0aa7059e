"""Deliberate deaths of verl's vLLM engine, for the end-to-end tests.

Imported in every verl process through ``VERL_USE_EXTERNAL_MODULES`` (the e2e test adds it next to the CPU
platform); it does nothing unless ``BV_BLEND_TEST_ENGINE_FAULT`` names a fault. Each SIGKILLs vLLM's engine core
process, as the kernel's OOM killer would, from vLLM's worker process (its child):

- ``kill_mid_generation``: during the generation of training step ``FAULT_STEP``, at the worker's second forward
  pass after that step's weight sync, so the step's requests are in flight;
- ``kill_before_sync``: when the weight sync for step ``FAULT_STEP`` reaches the worker, which then dies too, before
  it connects to verl's sender: an engine that died after one generation and before the next.

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
FAULT_STEP = 2
FORWARD_PASS = 2  # the second forward pass of the step: the first has prefilled, requests are decoding
EXTENSION_MODULE = "verl.workers.rollout.vllm_rollout.utils"
WORKER_MODULE = "vllm.v1.worker.gpu_worker"  # vLLM's CPUWorker inherits execute_model from this Worker

# Sync 1 loads the actor's weights over vLLM's dummy ones at start-up; sync s + 1 follows step s's update, so the
# generation of step s runs after sync s.
_state = {"syncs": 0, "passes": 0}


def _count_syncs(module: Any) -> None:
    extension = module.vLLMColocateWorkerExtension
    original = extension.update_weights_from_ipc

    def update_weights_from_ipc(self: Any, *args: Any, **kwargs: Any) -> Any:
        _state["syncs"] += 1
        _state["passes"] = 0
        if os.environ[FAULT_ENV] == "kill_before_sync" and _state["syncs"] == FAULT_STEP:
            _kill_engine_core(f"before the weight sync for step {FAULT_STEP}")
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
            os.environ[FAULT_ENV] == "kill_mid_generation"
            and _state["syncs"] == FAULT_STEP
            and scheduler_output.total_num_scheduled_tokens
        ):
            _state["passes"] += 1
            if _state["passes"] == FORWARD_PASS:
                _kill_engine_core(f"during the generation of step {FAULT_STEP}")
        return original(self, scheduler_output, *args, **kwargs)

    worker.execute_model = execute_model


if os.environ.get(FAULT_ENV):
    if os.environ[FAULT_ENV] not in FAULTS:
        raise ValueError(f"{FAULT_ENV}={os.environ[FAULT_ENV]!r}: use one of {FAULTS}.")
    wrapt.register_post_import_hook(_count_syncs, EXTENSION_MODULE)
    wrapt.register_post_import_hook(_inject, WORKER_MODULE)
