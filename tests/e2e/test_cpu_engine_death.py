"""A vLLM engine that dies (tests/e2e/engine_faults.py) must end the run quickly, and say so.

vLLM's engine core process is killed with SIGKILL, as the kernel's OOM killer would, in a real run of verl's stock
trainer on CPU:

- during a step's generation, its requests in flight: the run must exit non-zero within two minutes of the kill,
  name the cause in the CPU platform's own words (``RolloutEngineDied``, not only vLLM's and verl's tracebacks, one
  per request), record no step after it, and leave no process behind. Without the CPU platform's engine-death check
  (``BV_BLEND_CPU_ENGINE_DEATH_CHECK=0``) the run ends with verl's "no materializable trajectories. Enable
  trainer.v1.sampler.sync_refill_failed_groups" instead, and the test fails. This fault rides on the resumed process
  of the session's BV-Blend history run (tests/e2e/_history.py): it trains and saves step 3, then dies in step 4's
  generation (a run of its own until this round);
- between one step's generation and the next's: no request fails, and the next weight sync finds the dead worker.
  The same within two minutes, with the weight-sync deadline's ``WeightSyncTimeout``; without its send timeout the
  sync waits forever. This fault rides on the end of the session's SmolLM2 NTF run (tests/e2e/_ntf.py): after the
  steps that test_cpu_ntf.py reads, the sync of one step more meets the dead engine (a tiny model's run of its own
  until this round).

The other tests check the adaptation's parts on verl's real classes, without a run (seconds).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import types

import pytest

from instruments.cpu import cpu_env, rollout_patches
from instruments.cpu.checks import CpuAdaptationWarning
from instruments.cpu.launch import processes_of_run
from instruments.run.report import read_metrics
from tests.e2e._history import LAST_STEP, HistoryRun
from tests.e2e._launch import FAIL_FAST_S, Launch
from tests.e2e._ntf import STEPS as NTF_STEPS
from tests.e2e.engine_faults import fault_at_sync

CAUSE = "vLLM engine died during generation"


def _logged_steps(done: Launch) -> list[int]:
    return list(read_metrics(done.metrics).index) if done.metrics.is_file() and done.metrics.read_text().strip() else []


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.xdist_group("history")
def test_an_engine_that_dies_during_generation_ends_the_run_quickly_and_names_the_cause(
    bv_blend_run: HistoryRun,
) -> None:
    done = bv_blend_run.second
    assert done.after_fault_s is not None, f"the engine core was never killed; see {done.log}"
    assert done.rc != 0, "a run whose engine died must not exit 0"
    assert done.after_fault_s < FAIL_FAST_S, f"the run took {done.after_fault_s:.0f} s to end after the engine died"
    text = done.text()
    assert "RolloutEngineDied" in text and CAUSE in text, "the run's error must name the cause"
    assert "killed by SIGKILL" in text, "the error must say how the engine ended"
    # the resumed process trains step 3 (its sync 1 loads the checkpoint's weights), then dies in step 4's generation
    assert _logged_steps(done) == [LAST_STEP], f"steps recorded: {_logged_steps(done)}; none may follow the death"
    assert processes_of_run(done.run_id) == [], "processes of the run are still alive"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.xdist_group("single_runs")
def test_an_engine_that_dies_between_generations_ends_the_run_at_the_next_weight_sync(ntf_run: Launch) -> None:
    """No request fails, so the check above never runs: the weight sync meets the dead worker first. Its sender's
    first send then has no receiver, which only the sync deadline's send timeout ends."""
    done = ntf_run
    assert done.after_fault_s is not None, f"the engine core was never killed; see {done.log}"
    assert done.rc != 0, "a run whose engine died must not exit 0"
    assert done.after_fault_s < FAIL_FAST_S, f"the run took {done.after_fault_s:.0f} s to end after the engine died"
    text = done.text()
    assert "WeightSyncTimeout" in text and "no receiver" in text, "the run's error must name the cause"
    # verl logs a step after its closing weight sync (PPOTrainerSync.on_step_end): the last step ended in the sync
    # that met the dead engine
    steps = _logged_steps(done)
    assert steps == list(range(1, NTF_STEPS + 1)), f"steps recorded: {steps}; none may follow the death"
    assert processes_of_run(done.run_id) == [], "processes of the run are still alive"


# ----------------------------------------------------------------------------- the parts, on verl's real classes
class _Engine:
    def __init__(self, errored: bool, exits: dict[str, int]) -> None:
        manager = types.SimpleNamespace(finished_procs=lambda: dict(exits))
        self.errored = errored
        self.engine_core = types.SimpleNamespace(resources=types.SimpleNamespace(engine_manager=manager))


def test_engine_death_reports_how_the_engine_core_ended() -> None:
    server = types.SimpleNamespace
    assert rollout_patches.engine_death(server()) is None  # a server without an engine (an extra node)
    assert rollout_patches.engine_death(server(engine=_Engine(False, {}))) is None
    killed = rollout_patches.engine_death(server(engine=_Engine(True, {"EngineCore_DP0": -signal.SIGKILL})))
    assert killed is not None and "EngineCore_DP0 was killed by SIGKILL" in killed and "OOM" in killed
    failed = rollout_patches.engine_death(server(engine=_Engine(True, {"EngineCore_DP0": 1})))
    assert failed is not None and "exited with code 1" in failed
    assert "no exit code known" in str(rollout_patches.engine_death(server(engine=_Engine(True, {}))))


# verl's ReplayBuffer with the check, on a real TransferQueue:
# tests/bv_blend/verl/test_v1_advantage_step.py::test_the_replay_buffer_checks_the_engines_once_per_new_failed_group


PROBE = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import verl  # activates the CPU platform, as in every process of a run
    from verl.trainer.ppo.v1 import replay_buffer
    from verl.workers.config import RolloutConfig
    from verl.workers.rollout.vllm_rollout import vllm_async_server
    replica = vllm_async_server.vLLMReplica(replica_rank=0, config=RolloutConfig(name="vllm"), model_config=None)
from instruments.cpu import CpuAdaptationWarning, rollout_patches
print("RESULT" + json.dumps({"kept": replica in rollout_patches._REPLICAS,
    "buffer": getattr(replay_buffer.ReplayBuffer._sync_metadata_from_transfer_queue, "_bv_blend_cpu", False),
    "warnings": [str(w.message) for w in caught if issubclass(w.category, CpuAdaptationWarning)]}))
"""


@pytest.mark.slow
def test_the_check_is_installed_on_verls_classes_in_a_run_process() -> None:
    """A fresh process with the CPU platform's environment, as every process of a run: verl 0.9.1 has the shape the
    check relies on (no warning), the replay buffer is patched and each vLLM replica is kept for the check."""
    out = subprocess.run([sys.executable, "-c", PROBE], env=cpu_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT"))[len("RESULT") :])
    assert result == {"kept": True, "buffer": True, "warnings": []}


def test_the_check_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert rollout_patches.engine_check_enabled()
    monkeypatch.setenv(rollout_patches.ENGINE_CHECK_ENV, "0")
    assert not rollout_patches.engine_check_enabled()


def test_a_changed_verl_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-ins for a future verl without the shape the check relies on: each warns and is left alone."""

    class FutureReplayBuffer:
        def _sync_metadata_from_transfer_queue(self) -> None:
            self.groups = {}

        def sample(self) -> None:
            self._sync_metadata_from_transfer_queue()

        def wait_for_sampleable(self) -> None:
            self._sync_metadata_from_transfer_queue()

    future_buffer = types.ModuleType("future_replay_buffer")
    future_buffer.ReplayBuffer = FutureReplayBuffer
    with pytest.warns(CpuAdaptationWarning, match="engine-death check.*ReplayBuffer no longer collects failed groups"):
        rollout_patches._patch_replay_buffer(future_buffer)
    assert not getattr(FutureReplayBuffer._sync_metadata_from_transfer_queue, "_bv_blend_cpu", False)  # left alone

    class FutureReplica:
        async def launch_servers(self) -> None:
            self.server_handles = {}

    future_server = types.ModuleType("future_vllm_async_server")
    future_server.vLLMReplica = FutureReplica
    with pytest.warns(CpuAdaptationWarning, match="engine-death check.*no longer keeps its server actors"):
        rollout_patches._patch_replicas(future_server)


def test_a_fault_names_its_sync_and_a_malformed_setting_names_the_forms() -> None:
    assert fault_at_sync("kill_before_sync:6") == ("kill_before_sync", 6)
    assert fault_at_sync("kill_mid_generation:2") == ("kill_mid_generation", 2)
    for setting in ("kill_before_sync", "kill_before_sync:0", "kill_mid_generation:x", "kill:2"):
        with pytest.raises(ValueError, match="use one of kill_mid_generation:N, kill_before_sync:N"):
            fault_at_sync(setting)
