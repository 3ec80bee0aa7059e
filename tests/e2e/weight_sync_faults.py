"""Deliberate weight-sync faults for the end-to-end tests, injected into verl's real vLLM worker.

Imported in every verl process through ``VERL_USE_EXTERNAL_MODULES`` (the e2e tests add it next to the CPU
platform); it does nothing unless ``BV_BLEND_TEST_WEIGHT_SYNC_FAULT`` names a fault:

- ``fail:N``: the worker's N-th weight sync raises inside vLLM's worker, as a broken sync does (the launcher must
  then exit non-zero within two minutes instead of hanging); the syncs before it load. Sync 1 replaces vLLM's
  weights at start-up (a resumed process's: the checkpoint's); sync s + 1 follows the process's s-th update;
- ``stale``: the first sync (start-up, which replaces vLLM's dummy weights) loads; every later sync acknowledges
  each bucket without loading it, so vLLM keeps computing with the step-0 weights. This is the silent failure a
  packed copy left behind by a sync would cause; the freshness test must catch it.

Test code only: the package never imports it.
"""

from __future__ import annotations

import os
from typing import Any

import wrapt

FAULT_ENV = "BV_BLEND_TEST_WEIGHT_SYNC_FAULT"
INJECTED_FAILURE = "injected weight-sync failure (tests/e2e/weight_sync_faults.py)"
WORKER_MODULE = "verl.workers.rollout.vllm_rollout.utils"


def failing_sync(setting: str) -> int | None:
    """The sync that ``fail:N`` breaks; None for ``stale``. A malformed setting is an error that names the forms."""
    if setting == "stale":
        return None
    name, _, number = setting.partition(":")
    if name != "fail" or not number.isdigit() or int(number) < 1:
        raise ValueError(f"{FAULT_ENV}={setting!r}: use 'stale', or 'fail:N' for the N-th sync (1: start-up's).")
    return int(number)


def _inject(module: Any) -> None:
    fault = os.environ.get(FAULT_ENV, "")
    failing = failing_sync(fault)
    extension = module.vLLMColocateWorkerExtension
    load_bucket = extension._update_weights
    syncs = {"started": 0}
    original_sync = extension.update_weights_from_ipc

    def update_weights_from_ipc(self: Any, *args: Any, **kwargs: Any) -> Any:
        syncs["started"] += 1
        return original_sync(self, *args, **kwargs)

    def _update_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
        if syncs["started"] == failing:
            raise RuntimeError(INJECTED_FAILURE)
        if fault == "stale" and syncs["started"] > 1:
            return None  # the bucket is acknowledged but never loaded
        return load_bucket(self, *args, **kwargs)

    extension.update_weights_from_ipc = update_weights_from_ipc
    extension._update_weights = _update_weights


if os.environ.get(FAULT_ENV):
    failing_sync(os.environ[FAULT_ENV])  # a malformed setting fails in the first verl process, not in vLLM's worker
    wrapt.register_post_import_hook(_inject, WORKER_MODULE)
