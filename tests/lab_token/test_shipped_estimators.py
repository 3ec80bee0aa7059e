"""The token lab's history arms are the shipped estimators, bit for bit, and its prompts are pool.py's draws.

Every step of a tiny run of each history arm (SPO n=1, BV-Blend ``prompt_and_cluster`` n=2, each with and without
the prompt sampler; the derived sampler arm resolved to either of its candidates) is traced at the lab's call into
``bv_blend.verl.offline``: the token-level rewards, mask, uids, cluster ids and prompt keys it passed, and the
advantages it got back. The same steps then go, from an empty history, to ``SPOEstimator`` / ``BVBlendEstimator``
directly, with the arm's config and K; their advantages must equal the lab's bit for bit, the history must have
changed some advantage (a revisited prompt, a zero-variance group), and each step's prompts must be the ones the
seeded epoch order, or the shipped sampler draw from the direct estimator's history, gives.

The pool's draws (pool.py) are tested on their own at the end: the training pool, the epoch order and the sampler.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from bv_blend import BVBlendConfig, BVBlendEstimator
from bv_blend.history.sampler import draw, prompt_weights
from bv_blend.spo import SPOConfig, SPOEstimator
from bv_blend.verl import offline
from instruments.demo.task import FAMILIES, held_out_problems
from instruments.lab.token import advantages as advantages_module
from instruments.lab.token import run as run_module
from instruments.lab.token.advantages import TokenAdvantages, token_level_rewards
from instruments.lab.token.arms import ARMS, TokenArm
from instruments.lab.token.assets import load_clusters
from instruments.lab.token.pool import PromptOrder, sampled_prompts, training_pool
from tests.lab_token.conftest import TINY

# 6 steps over a pool of 16: every arm comes back to some prompt (an epoch is 2 steps at 8 prompts a step and 4 at
# 4; a sampler arm draws 48 or 24 prompts from 16). The run's evaluations: steps 0 and 6 only.
HISTORY_RUN = replace(TINY, steps=6, pool_size=16, eval_every=6)
SEED = 0
NUM_CLUSTERS = len(FAMILIES)

# The history arms of arms.ARMS; the derived sampler arm takes the estimator of bv2 or bv2_prompt, whichever wins.
HISTORY_ARMS: dict[str, TokenArm] = {
    "spo1": ARMS["spo1"],
    "spo1_sampler": ARMS["spo1_sampler"],
    "bv2_prompt": ARMS["bv2_prompt"],
    "bv2_best_sampler=bv2_prompt": ARMS["bv2_best_sampler"].resolved(ARMS["bv2_prompt"]),
    "bv2_best_sampler=bv2": ARMS["bv2_best_sampler"].resolved(ARMS["bv2"]),
}


# ------------------------------------------------------------------------------------------------ helpers
def _pool() -> tuple[np.ndarray, np.ndarray]:
    """The run's training pool, rebuilt here: each problem's question (its prompt key) and cluster (its family)."""
    settings = HISTORY_RUN
    held_out = {p.question for p in held_out_problems(settings.val_prompts, settings.model_seed)}
    pool = training_pool(settings.pool_size, settings.model_seed, held_out)
    return np.array([p.question for p in pool]), load_clusters(settings, Path(), pool)  # each family its cluster


def _direct(arm: TokenArm) -> SPOEstimator | BVBlendEstimator:
    """The shipped estimator of ``arm``, built from the arm's options (not through verl), with an empty history."""
    if arm.adv_estimator == "spo":
        return SPOEstimator(SPOConfig.from_mapping(arm.options.get("spo", {})))
    assert arm.adv_estimator == "bv_blend"
    return BVBlendEstimator(NUM_CLUSTERS, BVBlendConfig.from_mapping(arm.options["bv_blend"]))


def _feed(estimator: SPOEstimator | BVBlendEstimator, call: dict) -> torch.Tensor:
    """One traced call's batch into the estimator's own token-level face; its (B, R) advantages."""
    rewards, mask, uids = call["token_level_rewards"], call["response_mask"], call["uids"]
    if isinstance(estimator, SPOEstimator):
        advantages, _ = estimator.compute_token_level(rewards, mask, uids, call["prompt_keys"])
    else:
        keys = call["prompt_keys"] if estimator.config.uses_prompts else None
        advantages, _ = estimator.compute_token_level(rewards, mask, uids, call["cluster_ids"], prompt_keys=keys)
    return advantages


def _p_hat(estimator: SPOEstimator | BVBlendEstimator, keys: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """p^ per prompt by the sampler's documented rule (history_spec 5), read off the estimator itself: SPO's
    alpha / (alpha + beta); BV-Blend's prompt mean, else its cluster's mean, else 0.5 (no prior file here)."""
    if isinstance(estimator, SPOEstimator):
        return np.clip(estimator.success_estimates(list(keys))[0], 0.0, 1.0)
    p_hat = np.full(len(keys), 0.5)
    if estimator.config.uses_clusters:
        moments = estimator.moments
        p_hat = np.where(moments.seen[clusters], moments.mean[clusters], p_hat)
    if estimator.config.uses_prompts:
        _, mean, _, seen = estimator.prompts.lookup(list(keys))
        p_hat = np.where(seen, mean, p_hat)
    return np.clip(p_hat, 0.0, 1.0)


def _traced_run(arm: TokenArm, cache: str, monkeypatch) -> tuple[list[dict], list[dict], list[torch.Tensor]]:
    """One tiny run of ``arm``: (its calls into offline.compute_advantages, its on_step batches, its updates)."""
    calls, steps, updates = [], [], []
    real_compute, real_update = offline.compute_advantages, run_module.policy_gradient_step

    def compute(token_level_rewards, response_mask, uids, algorithm, cluster_ids=None, **kwargs):
        out = real_compute(token_level_rewards, response_mask, uids, algorithm, cluster_ids=cluster_ids, **kwargs)
        calls.append({"token_level_rewards": token_level_rewards.clone(), "response_mask": response_mask.clone(),
                      "uids": np.array(uids, copy=True), "cluster_ids": np.array(cluster_ids, copy=True),
                      "prompt_keys": np.array(kwargs.get("prompt_keys"), copy=True), "kwargs": set(kwargs),
                      "advantages": out.clone()})
        return out

    def update(model, optimizer, rollouts, advantages):
        updates.append(advantages.clone())
        return real_update(model, optimizer, rollouts, advantages)

    monkeypatch.setattr(advantages_module.offline, "compute_advantages", compute)
    monkeypatch.setattr(run_module, "policy_gradient_step", update)
    run_module.run(HISTORY_RUN, arm, seed=SEED, lr=1e-4, cache=cache, on_step=steps.append)
    assert len(calls) == len(steps) == len(updates) == HISTORY_RUN.steps
    return calls, steps, updates


# ------------------------------------------------------------------------------------------------ the arms
def test_the_history_arms_here_are_the_tables():
    """Every arm of arms.ARMS with a history (a prompt key, or the sampler) is replayed below: an arm added to the
    table without a check here fails this test."""
    history = {key for key, arm in ARMS.items() if arm.needs_prompt_keys or arm.sampler}
    assert history == {"spo1", "spo1_sampler", "bv2_prompt", "bv2_best_sampler"}
    assert {arm.key for arm in HISTORY_ARMS.values()} == history
    assert ARMS["bv2_best_sampler"].best_of == ("bv2", "bv2_prompt")
    assert dict(ARMS["bv2_prompt"].options) == {"bv_blend": {"history_level": "prompt_and_cluster"}}
    assert [HISTORY_ARMS[k].n for k in HISTORY_ARMS] == [1, 1, 2, 2, 2]


@pytest.mark.parametrize("name", list(HISTORY_ARMS))
def test_history_arms_equal_the_shipped_estimator_fed_the_same_steps(name, tiny_cache, random_scores, monkeypatch):
    """A tiny run of each history arm, replayed from an empty history into SPOEstimator / BVBlendEstimator (the
    arm's config, K = the 5 families): every step's advantages equal the lab's bit for bit, and are what the update
    got; each step's prompts are the next of the seeded epoch order, or, with the sampler, the shipped draw
    (prompt_weights, draw) from the direct estimator's p^ before the step with the run's sampler stream; at the end
    the lab's history gives the direct estimator's p^ for every pool prompt. The history was used: for SPO a step
    with a revisited prompt differs from a history-free estimator (and a step without one does not); for BV-Blend a
    zero-variance group got an advantage, and at the prompt level a revisited prompt's group differs from the cluster
    level fed the same steps (a first visit does not)."""
    arm = HISTORY_ARMS[name]
    calls, steps, updates = _traced_run(arm, tiny_cache, monkeypatch)
    pool_keys, pool_clusters = _pool()
    k, n = arm.prompts_per_step(HISTORY_RUN.budget), arm.n
    direct = _direct(arm)
    spo = isinstance(direct, SPOEstimator)
    prompt_level = not spo and direct.config.uses_prompts
    cluster_only = None if spo or not prompt_level else BVBlendEstimator(NUM_CLUSTERS, replace(direct.config,
                                                                                             history_level="cluster"))
    order, sampler_rng = PromptOrder(len(pool_keys), SEED), np.random.default_rng([SEED, 1])
    seen: set[str] = set()
    revisits = history_changed_spo = zero_variance_signal = prompt_changed = 0
    non_uniform = False
    for call, step, update in zip(calls, steps, updates, strict=True):
        # the batch: what the lab drew, as verl would see it
        if arm.sampler:
            weights = prompt_weights(_p_hat(direct, pool_keys, pool_clusters))
            non_uniform |= bool(np.ptp(weights) > 0)
            chosen = draw(weights, k, sampler_rng)
        else:
            chosen = order.take(k)
        np.testing.assert_array_equal(step["prompt_keys"], np.repeat(pool_keys[chosen], n))
        np.testing.assert_array_equal(call["cluster_ids"], np.repeat(pool_clusters[chosen], n))
        assert ("prompt_keys" in call["kwargs"]) == arm.needs_prompt_keys
        if arm.needs_prompt_keys:
            np.testing.assert_array_equal(call["prompt_keys"], step["prompt_keys"])
        groups = call["uids"].reshape(k, n)
        assert (groups == groups[:, :1]).all() and len(set(groups[:, 0])) == k
        scores = step["rollouts"].scores
        assert torch.equal(call["token_level_rewards"].sum(1), scores.float())
        keys = step["prompt_keys"]  # for the direct call: every arm's rows are keyed, whether the lab passes them
        call = {**call, "prompt_keys": keys}

        # the advantages: the lab's are the direct estimator's, bit for bit, and the update got them
        expected = _feed(direct, call)
        assert call["advantages"].dtype == expected.dtype
        np.testing.assert_array_equal(call["advantages"].numpy(), expected.numpy())
        assert torch.equal(step["advantages"], call["advantages"]) and torch.equal(update, call["advantages"])

        # the history was used
        revisited_rows = np.array([key in seen for key in keys])
        revisits += int(revisited_rows.any())
        if spo:
            fresh = _feed(_direct(arm), call)
            same = torch.equal(fresh, expected)
            assert same != bool(revisited_rows.any()), "SPO without a revisit must equal SPO without history"
            history_changed_spo += int(not same)
        else:
            rows = scores.view(k, n)
            all_equal = np.repeat((rows == rows[:, :1]).all(1).numpy(), n)
            zero_variance_signal += int((expected.abs().amax(1).numpy()[all_equal] > 0).any())
            if prompt_level:
                by_cluster = _feed(cluster_only, call).numpy()
                np.testing.assert_array_equal(expected.numpy()[~revisited_rows], by_cluster[~revisited_rows])
                prompt_changed += int((expected.numpy()[revisited_rows] != by_cluster[revisited_rows]).any())
        seen.update(keys.tolist())

    assert direct.num_updates == HISTORY_RUN.steps
    assert revisits > 0, "the run never came back to a prompt: its history was never read"
    if spo:
        assert history_changed_spo > 0, "no revisited prompt changed an SPO advantage"
    else:
        assert zero_variance_signal > 0, "no zero-variance group got an advantage: the history was never used"
        if prompt_level:
            assert prompt_changed > 0, "no revisited prompt's own history changed its advantage"
    if arm.sampler:
        assert non_uniform, "the sampler's weights were uniform at every step: it never read the history"
    # the lab's history, left in the process, gives the direct estimator's p^ (the sampler's next draw would agree)
    np.testing.assert_array_equal(offline.success_estimates(steps[-1]["algorithm"], pool_keys, pool_clusters),
                                  _p_hat(direct, pool_keys, pool_clusters))


# ------------------------------------------------------------------------------------------------ pool.py
def test_the_training_pool_is_round_robin_held_out_distinct_then_cycled_and_seeded():
    """training_pool: ``size`` problems (also a size the families do not divide), family by family in turn, none
    held out (whatever the held-out set), distinct within a family until its space is used up and then spread
    evenly over it, the same for a seed and different for another."""
    families = list(FAMILIES)
    held_out = {p.question for p in held_out_problems(120, 0)}
    pool = training_pool(23, 0, held_out)
    assert len(pool) == 23 and [p.family for p in pool] == [families[i % 5] for i in range(23)]
    assert all(len({p.question for p in pool if p.family == f}) == (5 if i < 3 else 4) for i, f in enumerate(families))
    assert pool == training_pool(23, 0, held_out) and pool != training_pool(23, 1, held_out)

    big = training_pool(320, 0, held_out)
    assert not {p.question for p in big} & held_out
    tiny_sum = [p.question for p in big if p.family == "tiny_sum"]  # 26 of its 50 prompts are not held out
    assert len(tiny_sum) == 64 and len(set(tiny_sum[:26])) == 26
    counts = Counter(tiny_sum)
    assert len(counts) == 26 and max(counts.values()) - min(counts.values()) <= 1

    space = [p.question for p in FAMILIES["tiny_sum"].space() if p.question not in held_out]
    keep = set(space[:3])
    small = training_pool(20, 0, held_out | (set(space) - keep))  # only 3 tiny_sum prompts left to train on
    assert {p.question for p in small if p.family == "tiny_sum"} == keep
    assert Counter(p.family for p in small) == {f: 4 for f in families}


def test_the_prompt_order_is_seeded_epochs_of_distinct_prompts_on_its_own_stream():
    """PromptOrder.take: a step never holds a prompt twice, every epoch is a permutation of the pool (three epochs,
    for every group size that divides it), a seed gives the same stream whatever the global numpy and torch
    generators do, and a step size that does not divide the pool is an error that says so."""
    for k in (1, 2, 4, 8, 16):
        order = PromptOrder(16, seed=3)
        takes = [order.take(k) for _ in range(3 * 16 // k)]
        assert all(len(set(t.tolist())) == k for t in takes)
        epochs = np.concatenate(takes).reshape(3, 16)
        assert all(sorted(e) == list(range(16)) for e in epochs) and len({tuple(e) for e in epochs}) == 3
    first = PromptOrder(16, seed=3)
    stream = [first.take(4) for _ in range(8)]
    again = PromptOrder(16, seed=3)
    replayed = []
    for _ in range(8):
        np.random.seed(0)  # other streams move; this one does not
        np.random.rand(7)
        torch.rand(5)
        replayed.append(again.take(4))
    np.testing.assert_array_equal(np.concatenate(stream), np.concatenate(replayed))
    with pytest.raises(ValueError, match="a pool of 16 is not a multiple of 3 prompts a step"):
        PromptOrder(16, seed=3).take(3)
    with pytest.raises(ValueError, match="not a multiple of 32"):
        PromptOrder(16, seed=3).take(32)


def _history(arm: TokenArm, pool_keys: np.ndarray, pool_clusters: np.ndarray) -> tuple[TokenAdvantages, object]:
    """The arm's lab estimator and its direct twin, both fed the same two fixed batches of 8 rows (k = 8 / n
    prompts each; the second batch revisits the first's prompts in reverse order)."""
    lab, direct = TokenAdvantages(arm, NUM_CLUSTERS), _direct(arm)
    k, mask = 8 // arm.n, torch.ones(8, 3, dtype=torch.int64)
    for step, scores in enumerate(([1, 1, 0, 0, 1, 0, 1, 1], [1, 1, 0, 0, 0, 1, 1, 0])):
        rows = np.repeat(np.arange(k) if step == 0 else np.arange(k)[::-1], arm.n)
        scores = torch.tensor(scores, dtype=torch.float32)
        uids = np.repeat(np.array([f"{step}:{j}" for j in range(k)], dtype=object), arm.n)
        lab_advantages = lab(scores, mask, uids, pool_clusters[rows], pool_keys[rows])
        call = {"token_level_rewards": token_level_rewards(scores, mask), "response_mask": mask, "uids": uids,
                "cluster_ids": pool_clusters[rows], "prompt_keys": pool_keys[rows]}
        np.testing.assert_array_equal(lab_advantages.numpy(), _feed(direct, call).numpy())
    return lab, direct


@pytest.mark.parametrize("name", ["spo1_sampler", "bv2_best_sampler=bv2_prompt", "bv2_best_sampler=bv2"])
def test_sampled_prompts_are_the_shipped_draw_from_the_estimators_history(name):
    """sampled_prompts: before any history every p^ is 0.5 (uniform weights); after two batches the p^ that
    bv_blend.verl.offline.success_estimates reads from the lab's estimator equals the direct estimator's, its
    weights are not uniform, and the k indices drawn are exactly draw(prompt_weights(p^), k, rng) on an equal
    generator (which ends in the same state): distinct, in the pool, int64."""
    arm = HISTORY_ARMS[name]
    pool_keys, pool_clusters = _pool()
    k = arm.prompts_per_step(HISTORY_RUN.budget)
    empty = TokenAdvantages(arm, NUM_CLUSTERS)
    np.testing.assert_array_equal(offline.success_estimates(empty.algorithm, pool_keys, pool_clusters),
                                  np.full(len(pool_keys), 0.5))
    lab, direct = _history(arm, pool_keys, pool_clusters)
    p_hat = offline.success_estimates(lab.algorithm, pool_keys, pool_clusters)
    np.testing.assert_array_equal(p_hat, _p_hat(direct, pool_keys, pool_clusters))
    weights = prompt_weights(p_hat)
    assert np.ptp(weights) > 0, "the history left every prompt's weight equal"
    for seed in range(5):
        ours, theirs = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 1])
        drawn = sampled_prompts(lab.algorithm, pool_keys, pool_clusters, k, ours)
        np.testing.assert_array_equal(drawn, draw(weights, k, theirs))
        assert drawn.dtype == np.int64 and len(set(drawn.tolist())) == k
        assert set(drawn.tolist()) <= set(range(len(pool_keys)))
        assert ours.bit_generator.state == theirs.bit_generator.state
