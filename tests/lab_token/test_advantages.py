"""The lab's advantages are verl's: recomputed with verl's own ``compute_advantage`` on the same batch, step by step
(BV-Blend's history included), they equal what the lab computed and what its policy-gradient step received."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bv_blend.verl import offline
from bv_blend.verl.channel import advantage_step
from instruments.lab.token import run as run_module
from instruments.lab.token.advantages import TokenAdvantages, token_level_rewards
from instruments.lab.token.arms import ARMS
from tests.lab_token.conftest import TINY


def test_the_score_sits_on_the_last_valid_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    rewards = token_level_rewards(torch.tensor([1.0, 1.0, 0.0]), mask)
    assert rewards.tolist() == [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]


def _verl_advantages(steps: list[dict], adv_estimator: str) -> list[torch.Tensor]:
    """Each step's advantages from verl's trainer function, with the estimator's history reset first."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    offline.reset_history(adv_estimator)
    out = []
    for step in steps:
        rollouts, algorithm = step["rollouts"], step["algorithm"]
        data = DataProto.from_dict(
            tensors={"token_level_rewards": token_level_rewards(rollouts.scores, rollouts.response_mask),
                     "response_mask": rollouts.response_mask},
            non_tensors={"uid": step["uids"]},
        )
        clusters = {str(u): int(c) for u, c in zip(step["uids"], step["cluster_ids"], strict=True)}
        with advantage_step(cluster_map=clusters):  # what the bv_blend trainer hooks publish around the call
            data = compute_advantage(data, adv_estimator, gamma=algorithm.gamma, lam=algorithm.lam,
                                     norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo, config=algorithm)
        out.append(data.batch["advantages"])
    return out


@pytest.mark.parametrize("key", ["grpo8", "grpo2", "bv8", "bv2", "rpp1"])
def test_run_uses_verls_advantages(key, tiny_cache, random_scores, monkeypatch):
    steps, updates = [], []
    real_step = run_module.policy_gradient_step

    def recording_step(model, optimizer, rollouts, advantages):
        updates.append(advantages.clone())
        return real_step(model, optimizer, rollouts, advantages)

    monkeypatch.setattr(run_module, "policy_gradient_step", recording_step)
    record = run_module.run(TINY, ARMS[key], seed=0, lr=1e-4, cache=tiny_cache, on_step=steps.append)
    expected = _verl_advantages(steps, ARMS[key].adv_estimator)
    assert len(steps) == len(updates) == TINY.steps
    for step, update, verl_adv in zip(steps, updates, expected, strict=True):
        assert torch.allclose(step["advantages"], verl_adv, atol=1e-6)
        assert torch.equal(update, step["advantages"])
    signal = [float((u.abs().amax(1) > 1e-6).float().mean()) for u in updates]
    assert record.signal == pytest.approx(signal)
    assert record.max_abs == pytest.approx([float(u.abs().max()) for u in updates])
    assert any(s > 0 for s in signal), "coin-flip scores should give some group a non-zero advantage"


def test_rows_of_a_group_share_a_uid_and_the_cluster_is_the_family(tiny_cache, random_scores):
    steps = []
    run_module.run(TINY, ARMS["bv2"], seed=1, lr=1e-4, cache=tiny_cache, on_step=steps.append)
    for step in steps:
        uids = step["uids"].reshape(-1, 2)
        assert (uids == uids[:, :1]).all() and len(set(uids[:, 0])) == len(uids)
        assert set(step["cluster_ids"]) <= set(range(5))
    assert steps[0]["uids"][0] != steps[1]["uids"][0]  # a new uid per prompt and step, as verl makes them


def test_prompt_keys_go_only_to_the_arms_that_need_them(monkeypatch):
    seen = []

    def recorded(*args, real=offline.compute_advantages, **kwargs):  # verl's real estimators, their inputs recorded
        seen.append(set(kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(offline, "compute_advantages", recorded)
    rows = (torch.ones(2), torch.ones(2, 3, dtype=torch.int64), np.array(["a", "b"], dtype=object),
            np.zeros(2, dtype=np.int64), np.array(["q1", "q2"], dtype=object))  # fmt: skip
    for key in ("grpo8", "bv2", "bv2_prompt", "spo1"):
        assert TokenAdvantages(ARMS[key], num_clusters=1)(*rows).shape == (2, 3)
    assert [("prompt_keys" in kw) for kw in seen] == [False, False, True, True]
    assert all("cluster_ids" in kw for kw in seen)


def test_a_run_is_reproducible(tiny_cache, random_scores):
    first = run_module.run(TINY, ARMS["bv2"], seed=3, lr=1e-4, cache=tiny_cache)
    second = run_module.run(TINY, ARMS["bv2"], seed=3, lr=1e-4, cache=tiny_cache)
    for name in ("pass_rate", "reward", "all_equal", "signal", "max_abs", "visits"):
        assert getattr(first, name) == getattr(second, name)
