"""The V1 trainer's advantage step (verl's default), and its step metrics, on a real TransferQueue started on CPU.

Rows are put into TransferQueue the way ``AgentLoopWorkerTQ`` does (key ``{uid}_{session}_{i}``, every dataset
column incl. ``extra_info``, the agent loop's ``num_turns`` and ``extra_fields``, the staleness tags), in shuffled
order; verl's real ``upsample_batch_to_divisible_size`` appends its synthetic padding rows. Then verl's real
``PPOTrainer._compute_advantage`` (patched by our plugin) runs on a ``PPOTrainerSync`` built with ``object.__new__``
and only ``config`` set: ``__init__``/``init()`` would start Ray workers on GPUs, and ``_compute_advantage`` reads
nothing else (``_compute_metrics`` reads a few more attributes, set by the test that calls it). Ray + TransferQueue
start-up takes ~30-70 s here.
"""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch
import transfer_queue as tq

from bv_blend import BVBlendEstimator
from bv_blend.verl import advisor, runtime
from tests.bv_blend.verl._helpers import (
    PAPER,
    PAPER_PROMPTS,
    PROMPT_AND_CLUSTER,
    K,
    compose_config,
    minimal_trainer,
    padded,
    step_rows,
)

# one worker runs this module: its module fixture is costly, and pytest-xdist would build it again on every
# worker that gets one of its tests (scripts/test.sh: --dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("transfer_queue_step")]


@pytest.fixture(scope="module")
def transfer_queue():
    import ray
    from omegaconf import OmegaConf

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield tq
    tq.close()
    ray.shutdown()


def _put_rows(rows: list[dict], partition_id: str):
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    fields, tags = [], []
    for row in rows:
        response = torch.full((row["response_mask"].numel(),), 7, dtype=torch.int64)
        prompt = torch.full((5,), 3, dtype=torch.int64)
        input_ids = torch.cat([prompt, response])
        fields.append(
            {
                "uid": row["uid"],
                "session_id": row["session_id"],
                "extra_info": row["extra_info"],
                "raw_prompt": row["raw_prompt"],
                "data_source": "test",
                "prompts": prompt,
                "responses": response,
                "input_ids": input_ids,
                "attention_mask": torch.ones_like(input_ids),
                "position_ids": torch.arange(input_ids.numel()),
                "response_mask": row["response_mask"],
                "rm_scores": row["rm_scores"],
                "rollout_log_probs": torch.zeros(response.numel()),
                "num_turns": 2,
                "extra_fields": row.get("extra_fields", {"min_global_steps": 0, "max_global_steps": 0}),
            }
        )
        tags.append({"status": "success", "global_steps": 0, "response_len": response.numel(),
                     "min_global_steps": 0, "max_global_steps": 0})  # fmt: skip
    keys = [row["key"] for row in rows]
    return tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=list_of_dict_to_tensordict(fields), tags=tags)


def _put_old_log_probs(batch, partition_id: str):
    """old_log_probs is computed after padding in verl's step (old_log_prob runs after _balance_batch)."""
    from tensordict import TensorDict

    lengths = tq.kv_batch_get(keys=batch.keys, partition_id=partition_id, select_fields=["response_mask"])
    old = TensorDict(
        {
            "old_log_probs": torch.nested.as_nested_tensor(
                [torch.zeros(m.numel()) for m in lengths["response_mask"].unbind()], layout=torch.jagged
            )
        },
        batch_size=len(batch),
    )
    return tq.kv_batch_put(keys=batch.keys, partition_id=partition_id, fields=old)


def test_v1_compute_advantage_gets_clusters_by_uid_and_writes_core_advantages(transfer_queue):
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    rows = step_rows(0)
    shuffled = random.Random(0).sample(rows, len(rows))
    batch = _put_rows(shuffled, partition_id="train")
    batch = upsample_batch_to_divisible_size(batch, batch_multiple=8, eos_token_id=0)  # 14 rows -> 16
    pad_keys = batch.keys[len(rows) :]
    assert len(pad_keys) == 2 and all(key.startswith("pad") for key in pad_keys)
    batch = _put_old_log_probs(batch, partition_id="train")

    config = compose_config([f"algorithm.bv_blend.num_clusters={K}", "actor_rollout_ref.rollout.n=4"])
    trainer = object.__new__(PPOTrainerSync)
    trainer.config = config
    estimator = runtime.estimator_for("bv_blend", config.algorithm).estimator
    seen = {}
    compute = estimator.compute_token_level

    def recording(rewards, mask, group_ids, cluster_ids, **options):
        seen.update(uids=list(group_ids), clusters=cluster_ids.tolist())
        return compute(rewards, mask, group_ids, cluster_ids, **options)

    estimator.compute_token_level = recording
    metrics: dict = {}
    trainer._compute_advantage(batch, metrics)

    cluster_of = {row["uid"]: row["cluster"] for row in rows}
    assert len(seen["uids"]) == len(batch.keys)
    for uid, cluster in zip(seen["uids"], seen["clusters"], strict=True):
        assert cluster == (-1 if uid.startswith("pad") else cluster_of[uid]), uid
    assert "bv_blend/effective_signal_ratio" in metrics and metrics == {**metrics, **estimator.metrics}

    independent = BVBlendEstimator(K)
    reference, _ = independent.compute_token_level(
        padded(rows, "rm_scores"),
        padded(rows, "response_mask"),
        np.array([r["uid"] for r in rows], dtype=object),
        torch.tensor([r["cluster"] for r in rows]),
    )
    # the logged metrics are those of an estimator fed the real rows alone (verl's padding rows count for nothing)
    logged = {k: v for k, v in metrics.items() if k in independent.metrics}
    assert logged == pytest.approx(independent.metrics, rel=1e-6, nan_ok=True)
    written = tq.kv_batch_get(
        keys=[r["key"] for r in rows] + pad_keys, partition_id="train", select_fields=["advantages"]
    )["advantages"].unbind()
    for i, row in enumerate(rows):
        n = row["response_mask"].numel()
        torch.testing.assert_close(written[i], reference[i, :n], rtol=1e-6, atol=1e-7)
    assert all(pad.abs().sum() == 0 for pad in written[len(rows) :])
    assert reference.abs().sum() > 0


def test_v1_multi_output_sessions_count_once_like_verl_grpo(transfer_queue):
    """An agent loop may return several outputs per session (keys ``{uid}_{session}_{i}``), each carrying the
    session's final reward. Without history, BV-Blend through the patched V1 step must equal verl's own GRPO path
    (``compute_advantage_for_multi_trajectories``), which counts each session's final output once."""
    import copy

    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    rows = [row for row in step_rows(7) if row["uid"].split("x")[0] != "s7g2"]  # drop the one-row group
    rng = random.Random(7)
    for row in [r for r in rows if r["session_id"] % 2 == 0]:
        earlier = copy.deepcopy(row)  # an earlier turn of the same session, with the final reward copied to it
        earlier["key"] = f"{row['uid']}_{row['session_id']}_0"
        earlier["response_mask"] = torch.ones(rng.randint(1, 6), dtype=torch.int64)
        earlier["rm_scores"] = torch.zeros(earlier["response_mask"].numel())
        earlier["rm_scores"][-1] = row["rm_scores"][-1]
        row["key"] = f"{row['uid']}_{row['session_id']}_1"
        rows.append(earlier)
    rows = rng.sample(rows, len(rows))
    batch = _put_old_log_probs(_put_rows(rows, partition_id="multi"), partition_id="multi")

    config = compose_config([f"algorithm.bv_blend.num_clusters={K}", "actor_rollout_ref.rollout.n=4"])
    trainer = object.__new__(PPOTrainerSync)
    trainer.config = config
    trainer._compute_advantage(batch, {})
    written = tq.kv_batch_get(keys=batch.keys, partition_id="multi", select_fields=["advantages"])["advantages"]

    from tests.bv_blend.verl._helpers import step_dataproto

    expected = compute_advantage_for_multi_trajectories(
        step_dataproto(rows), batch_keys=list(batch.keys), adv_estimator="grpo"
    ).batch["advantages"]
    for i, advantages in enumerate(written.unbind()):
        torch.testing.assert_close(advantages, expected[i, : advantages.numel()], rtol=1e-5, atol=1e-5)
    assert expected.abs().sum() > 0
    # The history counted each session once: after the cold start N_k = gamma * n0 + (sessions of cluster k).
    state = runtime.estimator_for("bv_blend", config.algorithm).estimator.state_dict()
    sessions = {(row["uid"], row["session_id"], row["cluster"]) for row in rows}
    expected_count = torch.zeros(K, dtype=torch.float64)
    for _, _, cluster in sessions:
        expected_count[cluster] += 1
    expected_count[expected_count > 0] += state["config"]["gamma"] * state["config"]["n0"]
    torch.testing.assert_close(state["count"], expected_count)


# --------------------------------------------------------------------------------------- HA-DW and MaxNorm-AC
@pytest.mark.parametrize("estimator", ["ha_dw", "maxnorm_ac"])
def test_v1_companion_estimators_write_their_advantages_and_metrics(transfer_queue, estimator):
    """The V1 step (shuffled rows, verl's padding rows) writes what the verl-free estimator computes on the real
    rows, and the step's ``metrics`` dict (what verl logs) carries the estimator's ``ha_dw/*`` / ``maxnorm/*``."""
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from bv_blend.companions import HADWEstimator, MaxNormAC

    rows = step_rows(3)
    partition = f"companion-{estimator}"
    batch = _put_rows(random.Random(3).sample(rows, len(rows)), partition_id=partition)
    batch = upsample_batch_to_divisible_size(batch, batch_multiple=8, eos_token_id=0)
    pad_keys = batch.keys[len(rows) :]
    assert pad_keys and all(key.startswith("pad") for key in pad_keys)
    batch = _put_old_log_probs(batch, partition_id=partition)

    trainer = object.__new__(PPOTrainerSync)
    trainer.config = compose_config([f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=4"])
    metrics: dict = {}
    trainer._compute_advantage(batch, metrics)

    prefix = {"ha_dw": "ha_dw/", "maxnorm_ac": "maxnorm/"}[estimator]
    ours = {k: v for k, v in metrics.items() if k.startswith(prefix)}
    assert len(ours) >= 8 and all(np.isfinite(v) for v in ours.values()), ours
    independent = HADWEstimator() if estimator == "ha_dw" else MaxNormAC()
    reference = independent.compute_token_level(
        padded(rows, "rm_scores"), padded(rows, "response_mask"), np.array([r["uid"] for r in rows], dtype=object)
    )[0]
    # the step's metrics are those of an estimator fed the real rows alone (verl's padding rows count for nothing)
    assert ours == pytest.approx(independent.metrics, rel=1e-6)
    written = tq.kv_batch_get(
        keys=[r["key"] for r in rows] + list(pad_keys), partition_id=partition, select_fields=["advantages"]
    )["advantages"].unbind()
    for i, row in enumerate(rows):
        torch.testing.assert_close(written[i], reference[i, : row["response_mask"].numel()], rtol=1e-6, atol=1e-7)
    assert all(pad.abs().sum() == 0 for pad in written[len(rows) :])
    assert reference.abs().sum() > 0


def test_v1_ha_dw_counts_each_multi_output_session_once(transfer_queue):
    """With several outputs per session, HA-DW uses each session's final output (as verl's GRPO does) for the
    groups and the batch accuracy, and gives the session's other outputs its advantage."""
    import copy

    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from bv_blend.companions import HADWEstimator

    finals = step_rows(8)
    rows = list(finals)
    for row in [r for r in finals if r["session_id"] % 2 == 0]:
        earlier = copy.deepcopy(row)
        earlier["key"] = f"{row['uid']}_{row['session_id']}_0"
        earlier["rm_scores"] = torch.zeros(row["response_mask"].numel())
        earlier["rm_scores"][-1] = row["rm_scores"][-1]  # verl copies the session's final reward to every output
        row["key"] = f"{row['uid']}_{row['session_id']}_1"
        rows.append(earlier)
    batch = _put_old_log_probs(_put_rows(random.Random(8).sample(rows, len(rows)), "multi-hadw"), "multi-hadw")

    trainer = object.__new__(PPOTrainerSync)
    trainer.config = compose_config(["algorithm.adv_estimator=ha_dw", "actor_rollout_ref.rollout.n=4"])
    metrics: dict = {}
    trainer._compute_advantage(batch, metrics)

    reference = HADWEstimator()
    expected = reference.compute(
        padded(finals, "rm_scores").sum(-1), np.array([r["uid"] for r in finals], dtype=object)
    )  # one row per session
    session_value = {(r["uid"], r["session_id"]): float(expected[i]) for i, r in enumerate(finals)}
    written = tq.kv_batch_get(keys=batch.keys, partition_id="multi-hadw", select_fields=["advantages", "uid"])
    keys = list(batch.keys)
    for key, advantages in zip(keys, written["advantages"].unbind(), strict=True):
        uid, session, _ = key.rsplit("_", 2)
        torch.testing.assert_close(advantages, torch.full_like(advantages, session_value[(uid, int(session))]),
                                   rtol=1e-6, atol=1e-7)  # fmt: skip
    assert metrics["ha_dw/batch_acc"] == pytest.approx(reference.metrics["ha_dw/batch_acc"])
    assert runtime.held("ha_dw").estimator.history.tolist() == reference.history.tolist()


# ------------------------------------------------------------------------------- SPO and BV-Blend's prompt level
@pytest.mark.parametrize(
    ("estimator", "overrides"),
    [
        ("spo", ["algorithm.adv_estimator=spo"]),
        ("bv_blend", [f"algorithm.bv_blend.num_clusters={K}", "algorithm.bv_blend.history_level=prompt_and_cluster"]),
    ],
)
def test_v1_prompt_histories_get_each_rows_prompt_key_from_transfer_queue(transfer_queue, estimator, overrides):
    """Two steps of the real V1 step (shuffled rows, verl's padding): the prompt keys come from each row's raw_prompt
    in TransferQueue, by uid, and the written advantages equal the verl-free estimator's on the real rows (the second
    step with the history of the first)."""
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from bv_blend import BVBlendConfig, SPOEstimator
    from bv_blend.history.keys import prompt_key

    trainer = object.__new__(PPOTrainerSync)
    trainer.config = compose_config([*overrides, "actor_rollout_ref.rollout.n=4"])
    reference = SPOEstimator() if estimator == "spo" else BVBlendEstimator(K, BVBlendConfig(
        history_level="prompt_and_cluster"))  # fmt: skip
    for step in (4, 5):
        rows = step_rows(step)
        partition = f"history-{estimator}-{step}"
        batch = _put_rows(random.Random(step).sample(rows, len(rows)), partition_id=partition)
        batch = upsample_batch_to_divisible_size(batch, batch_multiple=8, eos_token_id=0)
        batch = _put_old_log_probs(batch, partition_id=partition)
        metrics: dict = {}
        trainer._compute_advantage(batch, metrics)

        uids = np.array([r["uid"] for r in rows], dtype=object)
        keys = np.array([prompt_key(r["raw_prompt"]) for r in rows], dtype=object)
        scores, mask = padded(rows, "rm_scores"), padded(rows, "response_mask")
        if estimator == "spo":
            expected, _ = reference.compute_token_level(scores, mask, uids, keys)
        else:
            clusters = torch.tensor([r["cluster"] for r in rows])
            expected, _ = reference.compute_token_level(scores, mask, uids, clusters, prompt_keys=keys)
        written = tq.kv_batch_get(keys=[r["key"] for r in rows], partition_id=partition,
                                  select_fields=["advantages"])["advantages"].unbind()  # fmt: skip
        for i, row in enumerate(rows):
            torch.testing.assert_close(written[i], expected[i, : row["response_mask"].numel()], rtol=1e-6, atol=1e-7)
        assert {k: metrics[k] for k in reference.metrics} == pytest.approx(reference.metrics, rel=1e-12)
    prefix = "spo/prompts_tracked" if estimator == "spo" else "bv_blend/prompts_tracked"
    assert metrics[prefix] == len(set(keys.tolist()))  # step_rows repeats its prompts: the second step revisited


# ------------------------------------------------------------------------------------------ the step's metrics
@pytest.mark.parametrize(
    ("estimator", "source"),
    [("grpo", "reward_loop"), ("bv_blend", "reward_loop"), ("grpo", "colocated"), ("grpo", "no_such_key")],
)
def test_v1_step_metrics_count_the_verifier_failures(transfer_queue, estimator, source):
    """verl's real V1 ``_compute_metrics`` (patched by the plugin) after the step's ``_compute_advantage``: the
    reward's ``verifier_failure`` is summed over the real rows into ``reward/verifier_failures``, for any estimator,
    whether the streaming reward loop left it in each row's ``extra_fields["reward_extra_info"]`` or a colocated
    reward model wrote it back as a field (``_compute_reward_colocate``). verl's padding rows copy the first row
    (a failure here) and are not counted. A reward without the key gives no such metric."""
    from verl.single_controller.ray import ResourcePoolManager
    from verl.trainer.ppo.metric_utils import RolloutMoELoadBalanceMetricsAccumulator
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils import tensordict_utils as tu

    rows = random.Random(9).sample(step_rows(9), len(step_rows(9)))
    failures = [float(i % 3 == 0) for i in range(len(rows))]  # the first row (the padding's template) failed
    for row, failure in zip(rows, failures, strict=True):
        info = {"acc": row["rm_scores"][-1].item()}
        if source == "reward_loop":
            info["verifier_failure"] = failure
        if source != "colocated":
            row["extra_fields"] = {"min_global_steps": 0, "max_global_steps": 0, "reward_extra_info": info}
    partition = f"metrics-{estimator}-{source}"
    batch = _put_rows(rows, partition_id=partition)
    if source == "colocated":  # as _compute_reward_colocate writes a reward model's extra keys, before padding
        extras = {"verifier_failure": np.array(failures), "acc": np.array([r["rm_scores"][-1].item() for r in rows])}
        batch = tq.kv_batch_put(keys=batch.keys, partition_id=partition, fields=tu.get_tensordict(extras))
    batch = upsample_batch_to_divisible_size(batch, batch_multiple=8, eos_token_id=0)
    assert len(batch.keys) == len(rows) + 2
    batch = _put_old_log_probs(batch, partition_id=partition)

    overrides = [f"algorithm.bv_blend.num_clusters={K}"] if estimator == "bv_blend" else []
    config = compose_config([f"algorithm.adv_estimator={estimator}", *overrides, "actor_rollout_ref.rollout.n=4"])
    trainer = minimal_trainer(PPOTrainerSync, config, global_steps=1)
    trainer.resource_pool_manager = ResourcePoolManager(resource_pool_spec={"global_pool": [1]}, mapping={})
    trainer._rollout_moe_lb_metrics_accumulator = RolloutMoELoadBalanceMetricsAccumulator(
        config.actor_rollout_ref.model
    )
    metrics: dict = {}
    batch = trainer._compute_advantage(batch, metrics)
    trainer._compute_metrics(batch, metrics, {"step": 1.0, "gen": 0.5}, global_steps=1, epoch=0)

    assert metrics["response_length/mean"] > 0  # verl's own step metrics, beside ours
    if source == "no_such_key":
        assert "reward/verifier_failures" not in metrics
    else:
        assert metrics["reward/verifier_failures"] == sum(failures) == 5.0


# ------------------------------------------------------------------------ DAPO's dynamic sampling, as counted
def test_v1_trainer_advises_at_its_first_advantage_step(transfer_queue, caplog):
    """verl's real PPOTrainerSync constructor passes the trainer-start check and has no training set yet (no
    advice); once verl's init() has built it, verl's real advantage step (our hook around it) warns once, at the
    first step, and adds the advisor's metrics to the step's metrics at every step, beside the estimator's."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    config = compose_config([*PAPER, *PROMPT_AND_CLUSTER])
    with caplog.at_level(logging.DEBUG, logger=advisor.__name__):
        trainer = PPOTrainerSync(config)
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
        trainer.train_dataset = range(PAPER_PROMPTS)  # what verl's init() -> _init_dataloader() sets
        for step in range(2):
            batch = _put_old_log_probs(_put_rows(step_rows(step), partition_id=f"advice{step}"), f"advice{step}")
            metrics: dict[str, float] = {}
            trainer._compute_advantage(batch, metrics)
            assert metrics["advisor/visits_per_prompt"] == pytest.approx(16 * 500 / PAPER_PROMPTS)
            assert metrics["advisor/prompt_history_row_share"] == 0.0
            assert "bv_blend/effective_signal_ratio" in metrics
    warnings = [r for r in caplog.records if r.name == advisor.__name__ and r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "BV-Blend (algorithm.bv_blend.history_level=prompt_and_cluster)" in warnings[0].getMessage()


@pytest.mark.parametrize("estimator", ["bv_blend", "grpo"])
def test_v1_group_record_holds_each_groups_rewards_advantages_and_history(transfer_queue, tmp_path, estimator):
    """``+bv_blend.group_record=FILE``: after verl's real V1 advantage step, one strict JSON line per prompt group
    (padding left out): its step, prompt key, cluster, the rollouts' scores and advantages as verl wrote them to
    TransferQueue, and for BV-Blend the history's mean and weight that group's advantages used (those of an
    independent estimator fed the same two steps)."""
    import json

    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from bv_blend.history.keys import prompt_key

    path = tmp_path / "groups.jsonl"
    config = compose_config([f"algorithm.adv_estimator={estimator}", f"algorithm.bv_blend.num_clusters={K}",
                             "actor_rollout_ref.rollout.n=4", f"+bv_blend.group_record={path}"])
    runtime.reset()
    independent = BVBlendEstimator(K)
    written_by_step = {}
    for step in (1, 2):
        rows = step_rows(step)
        partition = f"record_{estimator}_{step}"
        batch = _put_rows(random.Random(step).sample(rows, len(rows)), partition_id=partition)
        batch = upsample_batch_to_divisible_size(batch, batch_multiple=8, eos_token_id=0)
        batch = _put_old_log_probs(batch, partition_id=partition)
        trainer = object.__new__(PPOTrainerSync)
        trainer.config, trainer.global_steps = config, step
        trainer._compute_advantage(batch, {})
        written = tq.kv_batch_get(keys=[r["key"] for r in rows], partition_id=partition,
                                  select_fields=["advantages"])["advantages"].unbind()  # fmt: skip
        written_by_step[step] = {r["key"]: float(a.mean()) for r, a in zip(rows, written, strict=True)}
        independent.compute_token_level(padded(rows, "rm_scores"), padded(rows, "response_mask"),
                                        np.array([r["uid"] for r in rows], dtype=object),
                                        torch.tensor([r["cluster"] for r in rows]))  # fmt: skip
        trace = independent.last_groups.by_group()
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        lines = [line for line in lines if line["step"] == step]
        by_key = {}
        for row in rows:
            by_key.setdefault(prompt_key(row["raw_prompt"]), []).append(row)
        assert len(lines) == len(by_key)  # one per group; verl's padding rows count for nothing
        for line in lines:
            group = by_key[line["prompt_key"]]
            uid = group[0]["uid"]
            assert line["cluster"] == group[0]["cluster"]
            assert sorted(line["rewards"]) == sorted(float(r["rm_scores"].sum()) for r in group)
            assert sorted(line["advantages"]) == pytest.approx(
                sorted(written_by_step[step][r["key"]] for r in group), abs=1e-4)
            if estimator == "bv_blend":
                assert line["history_mean"] == pytest.approx(trace[uid]["history_mean"], abs=1e-4)
                assert line["history_weight"] == pytest.approx(trace[uid]["history_weight"], abs=1e-4)
            else:
                assert "history_weight" not in line
    if estimator == "bv_blend":  # the second step read the first step's history: the record shows it
        assert any(line["history_weight"] > 0 for line in map(json.loads, path.read_text().splitlines())
                   if line["step"] == 2)


def test_the_group_record_is_refused_on_the_legacy_trainer_and_needs_a_path(tmp_path):
    from bv_blend.verl import group_record

    config = compose_config([f"+bv_blend.group_record={tmp_path / 'groups.jsonl'}", "trainer.use_v1=false"])
    with pytest.raises(ValueError, match="V1 trainer"):
        group_record.check_run(config, legacy=True)
    group_record.check_run(config, legacy=False)  # V1 writes it
    with pytest.raises(ValueError, match="must be a file path"):
        group_record.record_path(compose_config(["+bv_blend.group_record=[1,2]"]))
    assert group_record.record_path(compose_config([])) is None
