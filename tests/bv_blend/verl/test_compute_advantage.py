"""verl's own ``compute_advantage`` (legacy trainer path) with ``adv_estimator="bv_blend"``, against our core.

Everything here is verl 0.9.1's real code on CPU: ``verl.trainer.ppo.ray_trainer.compute_advantage`` and
``compute_data_metrics`` (as patched by our plugin, which ``import verl`` loaded through the entry point).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos, ray_trainer

from bv_blend import BVBlendConfig, BVBlendEstimator
from bv_blend.codebook import CLUSTER_KEY
from bv_blend.verl import runtime
from bv_blend.verl.clusters import MissingClusterError
from bv_blend.verl.hooks import METRICS_KEY
from tests.bv_blend.verl._helpers import K, padded, step_dataproto, step_rows


def algorithm(**bv_blend) -> OmegaConf:
    return OmegaConf.create({"adv_estimator": "bv_blend", "bv_blend": {"num_clusters": K, **bv_blend}})


def test_bv_blend_through_verl_equals_core_over_steps():
    """Three steps (the history carries over): verl's advantages equal BVBlendEstimator's, row for row."""
    config = algorithm(temperature=0.2)
    reference = BVBlendEstimator(K, BVBlendConfig(temperature=0.2))
    for step in range(3):
        rows = step_rows(step)
        data = ray_trainer.compute_advantage(step_dataproto(rows), adv_estimator="bv_blend", config=config)
        scores, mask = padded(rows, "rm_scores"), padded(rows, "response_mask")
        uids = np.array([r["uid"] for r in rows], dtype=object)
        expected, _ = reference.compute_token_level(scores, mask, uids, torch.tensor([r["cluster"] for r in rows]))
        torch.testing.assert_close(data.batch["advantages"], expected, rtol=0, atol=0)
        torch.testing.assert_close(data.batch["returns"], expected, rtol=0, atol=0)
        assert data.batch["advantages"].abs().sum() > 0
    assert runtime.estimator_for("bv_blend", config).estimator.num_updates == reference.num_updates == 3


def test_legacy_step_metrics_reach_compute_data_metrics():
    """RayPPOTrainer.fit merges compute_data_metrics(batch) into the step dict: bv_blend/* must be in it, once."""
    rows = step_rows(0)
    data = ray_trainer.compute_advantage(step_dataproto(rows), adv_estimator="bv_blend", config=algorithm())
    data.batch["responses"] = torch.ones_like(data.batch["response_mask"])
    data.batch["prompts"] = torch.ones_like(data.batch["response_mask"])
    mask = data.batch["response_mask"]
    data.batch["attention_mask"] = torch.cat([torch.ones_like(mask), mask], dim=1)
    metrics = ray_trainer.compute_data_metrics(batch=data, use_critic=False)
    estimator_metrics = runtime.estimator_for("bv_blend", algorithm()).estimator.metrics
    assert {k: metrics[k] for k in estimator_metrics} == estimator_metrics
    assert "bv_blend/effective_signal_ratio" in metrics and "critic/advantages/mean" in metrics
    assert not any(k.startswith("bv_blend/") for k in ray_trainer.compute_data_metrics(batch=data, use_critic=False))


def test_grpo_is_unchanged_with_bv_blend_installed():
    """Another estimator runs verl's unpatched code path: same numbers as the original function, no BV-Blend state."""
    rows = step_rows(1)
    patched = ray_trainer.compute_advantage(step_dataproto(rows), adv_estimator="grpo", config=algorithm())
    original = ray_trainer.compute_advantage.__wrapped__(step_dataproto(rows), adv_estimator="grpo", config=algorithm())
    torch.testing.assert_close(patched.batch["advantages"], original.batch["advantages"], rtol=0, atol=0)
    assert runtime.held("bv_blend") is None
    assert METRICS_KEY not in patched.meta_info


def test_padding_rows_get_zero_and_leave_history_alone():
    """verl's synthetic rows (uid 'pad...', empty mask) get advantage 0 and do not change the state."""
    rows = step_rows(0)
    pad = dict(rows[0], uid="pad0123", key="pad0123_0_0", response_mask=torch.zeros(2, dtype=torch.int64))
    padded_batch = step_dataproto([*rows, pad, pad])
    with_pad = ray_trainer.compute_advantage(padded_batch, adv_estimator="bv_blend", config=algorithm())
    state_with_pad = runtime.estimator_for("bv_blend", algorithm()).estimator.state_dict()
    runtime.reset()
    without = ray_trainer.compute_advantage(step_dataproto(rows), adv_estimator="bv_blend", config=algorithm())
    assert torch.equal(with_pad.batch["advantages"][: len(rows)], without.batch["advantages"])
    assert with_pad.batch["advantages"][len(rows) :].abs().sum() == 0
    state = runtime.estimator_for("bv_blend", algorithm()).estimator.state_dict()
    assert all(torch.equal(state[k], v) for k, v in state_with_pad.items() if isinstance(v, torch.Tensor))


def test_prompt_without_cluster_id_is_a_clear_error():
    rows = step_rows(0)
    rows[7]["extra_info"] = {"index": 2}  # the only row of its prompt
    with pytest.raises(MissingClusterError, match=rf"extra_info\['{CLUSTER_KEY}'\].*bv-blend codebook"):
        ray_trainer.compute_advantage(step_dataproto(rows), adv_estimator="bv_blend", config=algorithm())


def test_cluster_id_out_of_range_is_a_clear_error():
    rows = step_rows(0)
    rows[0]["extra_info"] = {CLUSTER_KEY: K}
    with pytest.raises(ValueError, match=rf"not a cluster id in 0..{K - 1}"):
        ray_trainer.compute_advantage(step_dataproto(rows), adv_estimator="bv_blend", config=algorithm())


def test_batch_without_extra_info_or_hooks_says_what_is_missing():
    with pytest.raises(MissingClusterError, match="5 prompt"):
        ray_trainer.compute_advantage(
            step_dataproto(step_rows(0), with_extra_info=False), adv_estimator="bv_blend", config=algorithm()
        )
    # The registered function called on its own (no trainer hook published a uid -> cluster map).
    data = step_dataproto(step_rows(0))
    estimator_fn = core_algos.get_adv_estimator_fn("bv_blend")
    with pytest.raises(MissingClusterError, match="hooks .*did not run"):
        estimator_fn(
            token_level_rewards=data.batch["token_level_rewards"],
            response_mask=data.batch["response_mask"],
            index=data.non_tensor_batch["uid"],
            config=algorithm(),
        )


def test_missing_k_and_unknown_option_are_clear_errors():
    with pytest.raises(ValueError, match="num_clusters=K"):
        ray_trainer.compute_advantage(step_dataproto(step_rows(0)), adv_estimator="bv_blend", config=None)
    with pytest.raises(ValueError, match=r"Unknown option\(s\) algorithm.bv_blend.\{temprature\}"):
        ray_trainer.compute_advantage(
            step_dataproto(step_rows(0)), adv_estimator="bv_blend", config=algorithm(temprature=0.2)
        )


def _one_group(rewards: list[float], cluster: int, uid: str) -> list[dict]:
    return [
        {"uid": uid, "extra_info": {CLUSTER_KEY: cluster, "index": 0, "split": "train"},
         "raw_prompt": [{"role": "user", "content": f"problem of {uid}"}],
         "response_mask": torch.ones(3, dtype=torch.int64), "rm_scores": torch.tensor([0.0, 0.0, r])}
        for r in rewards
    ]  # fmt: skip


def test_bounded_blend_worked_example_through_verl():
    """Companions spec 4: a first group with 1 right of 8 (no history, so GRPO's value) goes from 2.47 to 1 with
    algorithm.bv_blend.bounded_scale_tau; the ratio within the group is kept, and the history is the same."""
    rows = _one_group([1.0] + [0.0] * 7, cluster=1, uid="g0")
    plain = ray_trainer.compute_advantage(step_dataproto(rows), adv_estimator="bv_blend", config=algorithm())
    runtime.reset()
    config = algorithm(bounded_scale_tau=0.01)
    bounded = ray_trainer.compute_advantage(step_dataproto(rows), adv_estimator="bv_blend", config=config)
    unbounded, capped = plain.batch["advantages"][:, 0], bounded.batch["advantages"][:, 0]
    assert unbounded[0].item() == pytest.approx(0.875 / np.sqrt(1 / 8), rel=1e-5)  # 2.47
    assert capped[0].item() == pytest.approx(1.0, rel=1e-5) and capped[1].item() == pytest.approx(-1 / 7, rel=1e-5)
    torch.testing.assert_close(capped / capped[0], unbounded / unbounded[0])
    # An all-wrong group of the same cluster on the next step: history-based, and still within [-1, 1].
    later = ray_trainer.compute_advantage(
        step_dataproto(_one_group([0.0] * 8, cluster=1, uid="g1")), adv_estimator="bv_blend", config=config
    ).batch["advantages"][:, 0]
    assert bool((later < 0).all()) and later.abs().max().item() <= 1.0 + 1e-6
