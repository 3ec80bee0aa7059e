"""The instruments' readings of verl's real sync ``ReplayBuffer`` on a real TransferQueue (the product's advantage
step runs on the same in tests/bv_blend/verl/test_v1_advantage_step.py, whose fixture and row writer these
share): what the
comparison counts of verl's dynamic sampling (instruments/run/run_logs.py), and the CPU platform's engine-death check
(instruments/cpu/rollout_patches.py)."""

from __future__ import annotations

import pytest
import torch
import transfer_queue as tq

from tests.bv_blend.verl.test_v1_advantage_step import _put_rows, transfer_queue  # noqa: F401 (a module-scoped fixture)

# one TransferQueue (and Ray) a module: its tests stay on one xdist worker, beside the product's (scripts/test.sh)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("transfer_queue_step"),
              pytest.mark.usefixtures("transfer_queue")]


def test_dynamic_sampling_logs_groups_and_the_comparison_counts_their_rollouts():
    """verl's own sync ``ReplayBuffer`` with DAPO's filter (``algorithm.filter_groups``) on a real TransferQueue: five
    finished groups of four rollouts, three all-equal, a batch of one prompt. verl evicts the three and discards the
    surplus one, and logs ``evicted_samples`` = 3 and ``discarded_surplus_samples`` = 1: groups, not rollouts,
    whatever their names say. The pretrained-LM comparison judges that arm at the rollouts it generated
    (``run_logs.generated_rollouts``), so each counted group costs its 4 rollouts: 4 kept + 16 dropped."""
    import pandas as pd
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from instruments.run import run_logs

    n, rewards = 4, {"dapoA": [1, 1, 1, 1], "dapoB": [0, 0, 0, 0], "dapoC": [1, 0, 0, 1], "dapoD": [0, 1, 0, 0],
                     "dapoE": [1, 1, 1, 1]}  # fmt: skip
    rows = [{"key": f"{uid}_{session}_0", "uid": uid, "session_id": session, "extra_info": {"index": 0},
             "raw_prompt": [{"role": "user", "content": uid}], "response_mask": torch.ones(3, dtype=torch.int64),
             "rm_scores": torch.tensor([0.0, 0.0, float(r)])}
            for uid, scores in rewards.items() for session, r in enumerate(scores)]  # fmt: skip
    _put_rows(rows, partition_id="train")
    # as verl's trainer registers each prompt: a tag-only marker, here already finished
    tq.kv_batch_put(keys=list(rewards), partition_id="train",
                    tags=[{"is_prompt": True, "status": "finished", "global_steps": 1}] * len(rewards))  # fmt: skip
    refills = []
    buffer = ReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
                          max_off_policy_strategy="drop", sampler_kwargs={}, poll_interval=0.01,
                          refill_fn=refills.append, filter_groups_metric="reward", train_batch_size=1,
                          gen_batch_size=1)  # fmt: skip

    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=1)

    assert {key.split("_")[0] for key in batch.keys} <= {"dapoC", "dapoD"} and len(batch.keys) == n
    assert metrics["training/filter_groups/evicted_samples"] == 3  # dapoA, dapoB, dapoE: groups
    assert metrics["training/filter_groups/discarded_surplus_samples"] == 1  # the other mixed group
    assert refills == []  # enough groups were left: nothing drawn
    logged = {k: [v] for k, v in metrics.items() if k.startswith("training/")}
    logged = pd.DataFrame({"timing_s/step": [30.0], **logged}, index=pd.Index([1], name="step"))  # a run's step 1
    result = {"spec": {"n": n, "batch": 1}, **run_logs.filter_groups_of(logged)}
    assert run_logs.generated_rollouts(result, [0, 1]).tolist() == [0.0, n * 1 + n * (3 + 1)]


def test_the_replay_buffer_checks_the_engines_once_per_new_failed_group(monkeypatch):
    """The CPU platform's engine-death check (instruments/cpu/rollout_patches.py) on verl's real ReplayBuffer and a
    real TransferQueue: the engines are asked on each new failed prompt group only, and a dead engine raises in the
    trainer's process. The engines' state is the one stand-in (``_dead_engines``): the fault injected, since vLLM's
    engine processes are not started here."""
    from verl.trainer.ppo.v1 import replay_buffer

    from instruments.cpu import rollout_patches

    monkeypatch.setattr(
        replay_buffer.ReplayBuffer, "_sync_metadata_from_transfer_queue",
        replay_buffer.ReplayBuffer._sync_metadata_from_transfer_queue,
    )  # fmt: skip  (undone after the test: verl's own method again for the other tests)
    rollout_patches._patch_replay_buffer(replay_buffer)
    rollout_patches._patch_replay_buffer(replay_buffer)  # idempotent: not wrapped twice

    def mark(key: str, status: str) -> None:  # as verl's trainer tags a prompt group, tag only
        tq.kv_batch_put(keys=[key], partition_id="engine_check",
                        tags=[{"is_prompt": True, "status": status, "global_steps": 1}])  # fmt: skip

    checks: list[int] = []
    deaths: list[str] = []
    monkeypatch.setattr(rollout_patches, "_dead_engines", lambda: checks.append(1) or list(deaths))
    buffer = replay_buffer.ReplayBuffer("sync", {}, None, "drop", {})
    mark("engine_u1", "running")
    buffer._sync_metadata_from_transfer_queue()
    assert checks == []  # nothing failed: the engines are not asked
    mark("engine_u1", "failure")
    buffer._sync_metadata_from_transfer_queue()
    buffer._sync_metadata_from_transfer_queue()
    assert "engine_u1" in buffer.failure_keys["engine_check"]  # verl's own buffer saw the failure
    assert checks == [1]  # asked once for that group, and the engine lives: verl goes on as it would
    mark("engine_u2", "failure")
    deaths.append("vLLM rollout server of replica 0, node 0: its process EngineCore_DP0 was killed by SIGKILL")
    cause = "vLLM engine died during generation"  # as the end-to-end run's error names it (test_cpu_engine_death)
    with pytest.raises(rollout_patches.RolloutEngineDied, match=f"{cause}.*EngineCore_DP0 was killed by SIGKILL"):
        buffer._sync_metadata_from_transfer_queue()
