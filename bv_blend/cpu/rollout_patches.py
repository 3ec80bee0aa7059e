"""What keeps vLLM-CPU rollouts in step with the actor: live weights, and a weight sync that cannot hang.

1. Live weights (vllm/model_executor/layers/utils.py:466, ``dispatch_cpu_unquantized_gemm``). After loading a model,
   vLLM-CPU repacks every 2-D linear weight for a faster kernel: oneDNN for fp32 on any x86 CPU and for bf16 where
   oneDNN runs bf16 (AVX-512 and up), the SGL AMX kernel for small bf16 matrices on AMX CPUs. For linear layers it
   then replaces ``layer.weight`` with an empty Parameter (linear.py:216, ``remove_weight=True``); for the LM head
   it keeps the weight but computes with the packed copy (vocab_parallel_embedding.py:70, ``remove_weight=False``).
   verl syncs the actor's weights into ``layer.weight`` in place (``update_weights_from_ipc`` -> ``load_weights``):
   the first kind fails (``'Parameter' object has no attribute 'weight_loader'``), the second would compute with a
   stale copy if nothing repacked it. On the CPU platform every 2-D layer computes ``F.linear(x, layer.weight)``
   instead, on the live weight that verl writes: correct on every CPU and in every dtype, at the cost of vLLM's
   packed kernels, which a CPU test harness does not need. Non-2-D weights (MoE experts, conv1d) and meta weights
   keep vLLM's own dispatch.
2. A deadline on the weight sync (verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py:136/164/197). verl's
   sender waits for each bucket's acknowledgement with a blocking ZMQ ``recv()`` and no timeout, and awaits the
   receiver's own result only after the last bucket; when vLLM's worker fails to load a bucket, the sender, and so
   the trainer, wait forever. On the CPU platform the sender's socket gets a receive timeout, so the run fails with a
   ``WeightSyncTimeout`` that names the cause instead of hanging.

Both are installed as post-import hooks, so they cost nothing in processes that never import the module concerned,
and each checks the shape of the code it relies on, warning (``CpuAdaptationWarning``) when a release changes it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from types import ModuleType
from typing import Any

import wrapt

from bv_blend.cpu.checks import warn_changed

logger = logging.getLogger(__name__)

# Diagnostic switch: 0 turns the live-weight adaptation off (vLLM packs as it likes; docs/cpu.md says what breaks).
LIVE_WEIGHTS_ENV = "BV_BLEND_CPU_LIVE_WEIGHTS"
SYNC_TIMEOUT_ENV = "BV_BLEND_CPU_WEIGHT_SYNC_TIMEOUT_S"
DEFAULT_SYNC_TIMEOUT_S = 60.0
GEMM_MODULE = "vllm.model_executor.layers.utils"
GEMM_CALLERS = {  # module -> the class whose process_weights_after_loading imports the dispatch at call time
    "vllm.model_executor.layers.linear": "UnquantizedLinearMethod",
    "vllm.model_executor.layers.vocab_parallel_embedding": "UnquantizedEmbeddingMethod",
}
SENDER_MODULE = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"
_MARK = "_bv_blend_cpu"


class WeightSyncTimeout(RuntimeError):
    """vLLM's worker did not acknowledge a weight bucket in time: its weight load failed or it died."""


def live_weights_enabled() -> bool:
    return os.environ.get(LIVE_WEIGHTS_ENV, "1").strip() != "0"


def sync_timeout_s() -> float:
    raw = os.environ.get(SYNC_TIMEOUT_ENV, str(DEFAULT_SYNC_TIMEOUT_S))
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{SYNC_TIMEOUT_ENV}={raw!r} must be a number of seconds, e.g. 60.") from None
    if value <= 0:
        raise ValueError(f"{SYNC_TIMEOUT_ENV}={raw!r} must be > 0 seconds.")
    return value


# ------------------------------------------------------------------------------------------------ live weights
def _live_weight_dispatch(original: Any) -> Any:
    @functools.wraps(original)
    def dispatch_cpu_unquantized_gemm(layer: Any, remove_weight: bool) -> None:
        weight = layer.weight
        if weight.is_meta or weight.ndim != 2:
            return original(layer, remove_weight)  # not a dense linear layer: vLLM's own handling
        import torch.nn.functional as F

        # vLLM's cpu_unquantized_gemm calls layer.cpu_linear(x, layer.weight, bias): the weight of the call, live.
        layer.cpu_linear = F.linear

    setattr(dispatch_cpu_unquantized_gemm, _MARK, True)
    return dispatch_cpu_unquantized_gemm


def _patch_gemm_dispatch(utils: ModuleType) -> None:
    original = getattr(utils, "dispatch_cpu_unquantized_gemm", None)
    if original is None or getattr(original, _MARK, False):
        if original is None:
            warn_changed("live weights", f"{GEMM_MODULE}.dispatch_cpu_unquantized_gemm is gone; vLLM may pack weights")
        return
    if list(inspect.signature(original).parameters) != ["layer", "remove_weight"]:
        warn_changed("live weights", f"{GEMM_MODULE}.dispatch_cpu_unquantized_gemm changed its signature")
    gemm = getattr(utils, "cpu_unquantized_gemm", None)
    if gemm is None or "layer.cpu_linear(x, weight, bias)" not in inspect.getsource(gemm):
        warn_changed("live weights", f"{GEMM_MODULE}.cpu_unquantized_gemm no longer calls layer.cpu_linear")
    utils.dispatch_cpu_unquantized_gemm = _live_weight_dispatch(original)
    logger.info("bv_blend CPU: vLLM linear layers compute with their live weights (no repacking)")


def _check_gemm_caller(class_name: str) -> Any:
    def check(module: ModuleType) -> None:
        method = getattr(getattr(module, class_name, None), "process_weights_after_loading", None)
        wanted = f"from {GEMM_MODULE} import dispatch_cpu_unquantized_gemm"
        if method is None or wanted not in inspect.getsource(method):
            warn_changed(
                "live weights",
                f"{module.__name__}.{class_name}.process_weights_after_loading no longer imports "
                "dispatch_cpu_unquantized_gemm at call time, so the patched dispatch may not reach it",
            )

    return check


# ----------------------------------------------------------------------------------------- weight-sync deadline
def _patch_weight_sender(module: ModuleType) -> None:
    sender = getattr(module, "BucketedWeightSender", None)
    init_socket = getattr(sender, "_init_socket", None)
    send = getattr(sender, "async_send_weights", None)
    if init_socket is None or send is None or "self.socket.recv()" not in inspect.getsource(send):
        warn_changed("weight-sync deadline", f"{SENDER_MODULE}.BucketedWeightSender changed; a failed sync may hang")
        return
    if getattr(send, _MARK, False):
        return
    import zmq

    timeout_s = sync_timeout_s()

    @functools.wraps(init_socket)
    def _init_socket(self: Any) -> None:
        init_socket(self)
        self.socket.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))

    @functools.wraps(send)
    async def async_send_weights(self: Any, weights: Any) -> None:
        try:
            await send(self, weights)
        except zmq.Again as exc:
            raise WeightSyncTimeout(
                f"verl's weight sync to the vLLM-CPU rollout engine got no acknowledgement within {timeout_s:.0f} s "
                "(bv_blend CPU platform): the vLLM worker failed to load the actor's weights, or died. Its own error "
                "is in the log above (search for 'update_weights_from_ipc' or 'Traceback'). Raise the limit with "
                f"{SYNC_TIMEOUT_ENV} if a large model only needs longer."
            ) from exc

    setattr(async_send_weights, _MARK, True)
    sender._init_socket = _init_socket
    sender.async_send_weights = async_send_weights


def install() -> None:
    """Register both adaptations as post-import hooks; each hook is idempotent, so a second install is harmless."""
    if live_weights_enabled():
        wrapt.register_post_import_hook(_patch_gemm_dispatch, GEMM_MODULE)
        for module, class_name in GEMM_CALLERS.items():
            wrapt.register_post_import_hook(_check_gemm_caller(class_name), module)
    else:
        logger.warning("bv_blend CPU: %s=0, vLLM may repack weights and break verl's weight sync", LIVE_WEIGHTS_ENV)
    wrapt.register_post_import_hook(_patch_weight_sender, SENDER_MODULE)
