"""The logistic lab's no-revisit regime (issue 29; results/regime.md, results in results/lab/regime.md).

Users train on a dataset far larger than the run: no prompt is ever drawn twice. Here the lab's task (the same 16
clusters, the same difficulty model and features, ``instruments.lab.env.Task``) is widened to a pool of
``steps x budget`` prompts (the arm with the most prompts a step, n = 1, takes 128 a step) plus a held-out split
of the same clusters that no run draws. Everything else is the lab's frozen base (results/lab.md, "Environment"):
Adam lr 0.005 with clip 1.0, 128 rollouts a step, 250 steps, 10 seeds.

A run (:func:`run_regime`), per step t, with P = budget / n prompts a step:

    prompts = order[t P : (t + 1) P]      one seeded permutation of the pool, the same for every arm of a seed
    rows    = n rollouts each (the oracle allocation: Knapsack sizes from the true p, 0 or 2..16, summing to 128)
    R       = 1[U[prompt, r] < p]        rollout r of a prompt reads the prompt's own uniform: arms are coupled by
                                          prompt, whatever step they reach it at
    A       = the arm's estimator, through verl's registered function (``bv_blend.verl.offline``), rows grouped
              by uid as verl's trainer groups them (groups may differ in size)
    theta  += Adam(clip(mean_i A_i d log pi_i / d theta))   the lab's exact score-function gradient

The judged quantity is the expected success (the true p, not sampled) over the held-out split, after each step.
The arms with a cluster history read a noisy codebook (a share ``NOISY_SHARE`` of prompts put in a random cluster)
whose NMI against the true clusters is 0.35, the real MiniLM codebook's (:func:`calibrate_share` picked the share
on the labels alone). The priors arms read 8 scores per pool prompt of the initial policy, drawn per seed (each
seed is its own task), through the package's own prior path: a prior file that SPO reads as
``algorithm.spo.offline_values`` and BV-Blend as ``algorithm.bv_blend.prior_file``, warm-started by the options'
``prepare`` at "trainer start" as verl's start-up does (``bv_blend.verl.compositions.check_run``).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf
from sklearn.metrics import normalized_mutual_info_score

from bv_blend.codebook.codebook import CLUSTER_KEY
from bv_blend.history.priors import write_priors
from bv_blend.verl import offline, runtime
from instruments import regime
from instruments.allocation import knapsack_allocation
from instruments.lab.env import EnvConfig, Policy, Task, _stream, sigmoid
from instruments.lab.estimators import ESTIMATORS, Advantages, EstimatorSpec
from instruments.lab.optim import Optimizer, OptimizerConfig
from instruments.lab.suites import ADAM, BASE_ENV

BUDGET = BASE_ENV.rollouts_per_step  # 128 rollouts a step, every arm
STEPS, SEEDS = 250, 10  # the full suite's frozen length and seeds
POOL_PER_CLUSTER = 2000  # 16 x 2,000 = 32,000 = 250 steps x 128 prompts (n = 1): no prompt can come back
HELD_OUT_PER_CLUSTER = 64  # 1,024 held-out prompts, as many as the lab's whole task had
NMI_TARGET = 0.35  # the real codebook's NMI against source on real math problems (results/regime.md)
# Share of prompts the noisy codebook puts in a random cluster: calibrate_share(range(10)) on the labels alone, before
# any run (0.4442 to 4 digits; mean NMI 0.350 over seeds 0-9, 0.347-0.354 by seed; a test recomputes it).
NOISY_SHARE = 0.444
PRIOR_SAMPLES = 8  # SPO's offline_N
KNAPSACK_LOW, KNAPSACK_HIGH = 2, 16
MAX_ROLLOUTS = KNAPSACK_HIGH  # uniforms drawn per prompt: enough for the largest group of any arm
# Streams of one seed beyond the lab's (env.py uses 0-8): an added stream never moves the task's.
_ORDER, _ROLLOUTS, _STYLES, _UIDS, _NOISY, _PRIORS = range(20, 26)


@dataclass(frozen=True)
class LabArm:
    """How the lab runs one arm of ``instruments.regime.ARMS``."""

    estimator: EstimatorSpec
    n: int  # rollouts a prompt (the Knapsack arm: the budget over its prompts, 2 on average)
    priors: bool = False
    knapsack: bool = False


LAB_ARMS: dict[str, LabArm] = {
    "grpo8": LabArm(ESTIMATORS["grpo"], 8),
    "grpo2": LabArm(ESTIMATORS["grpo"], 2),
    "rpp1": LabArm(ESTIMATORS["reinforce_pp"], 1),
    "bv_cluster1": LabArm(ESTIMATORS["bv_sem"], 1),  # BV-Blend's defaults: history_level=cluster
    "bv_cluster2": LabArm(ESTIMATORS["bv_sem"], 2),
    "bv_cluster8": LabArm(ESTIMATORS["bv_sem"], 8),
    "spo1": LabArm(ESTIMATORS["spo"], 1),
    "spo1_priors": LabArm(ESTIMATORS["spo"], 1, priors=True),
    "bv2_priors": LabArm(ESTIMATORS["bv_prompt_cluster"], 2, priors=True),
    "oracle_baseline1": LabArm(ESTIMATORS["oracle"], 1),
    "knapsack_grpo2": LabArm(ESTIMATORS["grpo"], 2, knapsack=True),
}
PRIORS_TWINS = regime.PRIORS_TWINS  # each priors arm's twin without priors, declared with the arm


@dataclass(frozen=True)
class RegimeSpec:
    """Everything that determines one regime run's numbers (its repr keys the run cache)."""

    arm: str
    seed: int = 0
    lr_scale: float = 1.0
    steps: int = STEPS
    budget: int = BUDGET
    pool_per_cluster: int = POOL_PER_CLUSTER
    held_out_per_cluster: int = HELD_OUT_PER_CLUSTER
    noisy_share: float = NOISY_SHARE
    env: EnvConfig = BASE_ENV  # the difficulty model and the policy; its batch shape is the arm's, not this
    optimizer: OptimizerConfig = ADAM

    def __post_init__(self) -> None:
        if self.arm not in LAB_ARMS:
            raise ValueError(f"RegimeSpec.arm={self.arm!r}: use one of {', '.join(LAB_ARMS)}.")
        drawn = self.steps * self.budget  # the n = 1 arms' prompts: the most any arm draws
        pool = self.env.num_clusters * self.pool_per_cluster
        if self.env.drift_std:
            raise ValueError("the regime's task is stationary (the lab's base): env.drift_std must be 0.")
        if drawn > pool:
            raise ValueError(f"{self.steps} steps x {self.budget} prompts need a pool of {drawn}, not {pool}: raise "
                             "pool_per_cluster, or a prompt would come back.")

    @property
    def prompts_per_step(self) -> int:
        return self.budget // LAB_ARMS[self.arm].n


@dataclass
class RegimeResult:
    held_out: np.ndarray  # (steps + 1,) expected held-out success before each step and after the last
    drawn: np.ndarray  # every prompt given rollouts, step after step (int32): what the revisit count reads
    rows: np.ndarray  # (steps,) rollouts spent each step
    sizes: np.ndarray  # (steps, P) rollouts of each of the step's prompts (0: skipped by the Knapsack allocation)
    rewards: np.ndarray  # every row's 0/1 reward, step after step (uint8)
    advantages: np.ndarray  # every row's advantage, step after step (float64)
    final_params: np.ndarray
    nonfinite_step: int | None
    seconds: float


class RegimeTask:
    """One seed's widened task: the lab's ``Task`` with pool + held-out prompts per cluster, and the regime's draws."""

    def __init__(self, spec: RegimeSpec) -> None:
        per_cluster = spec.pool_per_cluster + spec.held_out_per_cluster
        env = replace(spec.env, prompts_per_cluster=per_cluster, prompts_per_step=1, group_size=1)
        self.task = Task(env, spec.seed, steps=1)  # features, difficulties: the lab's model, nothing else of it
        count = env.num_prompts
        held = np.arange(count) % per_cluster >= spec.pool_per_cluster  # prompts are i.i.d. within a cluster
        self.pool, self.held_out = np.flatnonzero(~held), np.flatnonzero(held)
        self.order = self.pool[_stream(spec.seed, _ORDER).permutation(self.pool.size)]
        self.uniforms = _stream(spec.seed, _ROLLOUTS).random((count, MAX_ROLLOUTS))
        self.style_uniforms = _stream(spec.seed, _STYLES).random((count, MAX_ROLLOUTS))
        self.cluster_ids = noisy_codebook(self.task.cluster, spec.noisy_share, spec.seed)
        self.keys = self.task.prompt_keys()
        self._uid_hex = _stream(spec.seed, _UIDS).bytes(16 * count).hex()

    def uids(self, prompts: np.ndarray) -> np.ndarray:
        """One uuid-4-shaped uid per prompt: each prompt is drawn once, so one per prompt and step."""
        hexes = (self._uid_hex[32 * j : 32 * j + 32] for j in prompts.tolist())
        return np.array([f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{h[16:20]}-{h[20:]}" for h in hexes], dtype=object)

    def prior_scores(self, seed: int) -> dict[str, list[float]]:
        """PRIOR_SAMPLES scores of the initial policy (theta = 0) for every pool prompt."""
        start = sigmoid(Policy(self.task).logits(self.task.difficulty(0)))[self.pool]
        scores = _stream(seed, _PRIORS).random((self.pool.size, PRIOR_SAMPLES)) < start[:, None]
        return {key: row.astype(float).tolist() for key, row in zip(self.keys[self.pool], scores, strict=True)}


def noisy_codebook(clusters: np.ndarray, share: float, seed: int) -> np.ndarray:
    """The true clusters, with ``share`` of the prompts put in a uniformly random cluster (possibly their own)."""
    rng = _stream(seed, _NOISY)
    moved = rng.random(clusters.size) < share
    return np.where(moved, rng.integers(0, int(clusters.max()) + 1, clusters.size), clusters)


def codebook_nmi(seed: int, share: float = NOISY_SHARE, num_clusters: int = BASE_ENV.num_clusters,
                 pool_per_cluster: int = POOL_PER_CLUSTER) -> float:
    """NMI of a seed's noisy codebook against the true clusters, over the pool (the prompts it labels for training;
    the pool's clusters are the lab's ``np.repeat``, so no task needs building)."""
    clusters = np.repeat(np.arange(num_clusters), pool_per_cluster)
    return float(normalized_mutual_info_score(clusters, noisy_codebook(clusters, share, seed)))


def calibrate_share(seeds: range, target: float = NMI_TARGET, tolerance: float = 1e-4) -> float:
    """The share whose mean NMI over ``seeds`` is ``target``, by bisection on the labels alone (NMI falls with it)."""
    low, high = 0.0, 1.0
    while high - low > tolerance:
        middle = (low + high) / 2
        mean = float(np.mean([codebook_nmi(seed, middle) for seed in seeds]))
        low, high = (middle, high) if mean > target else (low, middle)
    return (low + high) / 2


def row_gradient(policy: Policy, prompts: np.ndarray, sizes: np.ndarray, success_prob: np.ndarray,
                 rewards: np.ndarray, styles: np.ndarray, style_probs: np.ndarray,
                 advantages: np.ndarray) -> np.ndarray:  # fmt: skip
    """``Policy.gradient`` for groups of any sizes: rows grouped by prompt, in order (``sizes[k]`` rows of prompt k).

    mean_i A_i d log pi(R_i, m_i) / d theta over the step's rows, verl's token-mean loss with one token a response.
    """
    rows, count = advantages.size, prompts.size
    group = np.repeat(np.arange(count), sizes)
    success_weight = np.bincount(group, advantages * (rewards - success_prob[group]), minlength=count) / rows
    grad = success_weight @ policy.features[prompts]
    style_weight = np.zeros_like(style_probs)
    np.add.at(style_weight, (group, styles), advantages)
    style_weight -= np.bincount(group, advantages, minlength=count)[:, None] * style_probs
    return grad + style_weight.ravel() @ policy.style_features[prompts].reshape(style_probs.size, -1) / rows


def run_regime(spec: RegimeSpec) -> RegimeResult:
    """One run of one arm on one seed, from an empty history (and, with priors, from the prior file)."""
    start = time.perf_counter()
    lab_arm, world = LAB_ARMS[spec.arm], RegimeTask(spec)
    policy = Policy(world.task)
    optimizer = Optimizer(spec.optimizer, policy.params.size, spec.lr_scale)
    per_step = spec.prompts_per_step
    held_out = np.zeros(spec.steps + 1)
    sizes = np.zeros((spec.steps, per_step), dtype=np.int16)
    drawn, rewards_log, advantages_log = [], [], []
    nonfinite_step = None
    difficulty = world.task.difficulty(0)
    with tempfile.TemporaryDirectory(prefix="bv_regime_") as folder:
        estimator = _estimator(lab_arm, world, spec.seed, Path(folder))
        for step in range(spec.steps):
            held_out[step] = _success(policy, difficulty, world.held_out).mean()
            prompts = world.order[step * per_step : (step + 1) * per_step]
            success_prob = _success(policy, difficulty, prompts)
            if lab_arm.knapsack:  # the limit: the true p decides the split, and a prompt given 0 is not trained on
                sizes[step] = knapsack_allocation(success_prob, spec.budget, KNAPSACK_LOW, KNAPSACK_HIGH)
            else:
                sizes[step] = lab_arm.n
            kept = sizes[step] > 0
            prompts, success_prob, counts = prompts[kept], success_prob[kept], sizes[step][kept].astype(np.int64)
            prompt_of_row = np.repeat(prompts, counts)
            rollout = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)  # r within its group
            p_row = np.repeat(success_prob, counts)
            rewards = (world.uniforms[prompt_of_row, rollout] < p_row).astype(np.float64)
            style_probs = policy.style_probs(prompts)
            cumulative = np.cumsum(style_probs, axis=1)[np.repeat(np.arange(prompts.size), counts)]
            styles = (world.style_uniforms[prompt_of_row, rollout][:, None] > cumulative).sum(axis=1)
            styles = np.minimum(styles, spec.env.num_styles - 1)  # a cumulative sum that ends just below 1
            advantages = _advantages(estimator, rewards, np.repeat(world.uids(prompts), counts),
                                     world.cluster_ids[prompt_of_row], world.keys[prompt_of_row], p_row)
            drawn.append(prompts)
            rewards_log.append(rewards.astype(np.uint8))
            advantages_log.append(advantages)
            if not np.isfinite(advantages).all():  # a trainer would crash here: the run stops, its policy frozen
                nonfinite_step = step
                held_out[step + 1 :] = held_out[step]
                break
            policy.params += optimizer.step(row_gradient(policy, prompts, counts, success_prob, rewards, styles,
                                                         style_probs, advantages))  # fmt: skip
        else:
            held_out[spec.steps] = _success(policy, difficulty, world.held_out).mean()
    return RegimeResult(held_out, np.concatenate(drawn).astype(np.int32), sizes.sum(axis=1), sizes,
                        np.concatenate(rewards_log), np.concatenate(advantages_log), policy.params.copy(),
                        nonfinite_step, time.perf_counter() - start)  # fmt: skip


def _success(policy: Policy, difficulty: np.ndarray, prompts: np.ndarray) -> np.ndarray:
    """The true p of ``prompts`` only (``Policy.logits`` would score the whole widened task)."""
    return sigmoid(policy.features[prompts] @ policy.params - difficulty[prompts])


def _estimator(lab_arm: LabArm, world: RegimeTask, seed: int, folder: Path) -> Advantages:
    """The arm's estimator with a fresh history; a priors arm's starts from its prior file, as at trainer start."""
    spec, num_clusters = lab_arm.estimator, int(world.cluster_ids.max()) + 1
    if not lab_arm.priors:
        return Advantages(spec, num_clusters)
    prior_file = folder / "priors.json"
    write_priors(prior_file, world.prior_scores(seed))
    # The training file a user's run reads: the pool's rows, keyed by extra_info["index"], with their cluster ids.
    keys = world.keys[world.pool]
    train = folder / "train.parquet"
    rows = [{"index": key, CLUSTER_KEY: int(c)} for key, c in zip(keys, world.cluster_ids[world.pool], strict=True)]
    pd.DataFrame({"prompt": keys, "extra_info": rows}).to_parquet(train)
    name = spec.adv_estimator
    section = {"spo": {"offline_values": str(prior_file)}, "bv_blend": {"prior_file": str(prior_file)}}[name]
    section["prompt_key_field"] = "index"  # the file's keys are the rows' extra_info["index"], as the lab's keys
    options = {name: {**spec.options.get(name, {}), **section}}
    advantages = Advantages(replace(spec, label=f"{spec.label} + offline priors", options=options), num_clusters)
    process = runtime.process_for(name, advantages.algorithm)
    config = OmegaConf.create({"data": {"train_files": [str(train)], "prompt_key": "prompt"}})
    process.options.prepare(process.estimator, config)  # what check_run does at trainer start
    return advantages


def _advantages(estimator: Advantages, rewards: np.ndarray, uids: np.ndarray, cluster_ids: np.ndarray,
                keys: np.ndarray, success_prob: np.ndarray) -> np.ndarray:  # fmt: skip
    """One advantage per row: verl's registered estimator on (B, 1) rewards grouped by uid, or the oracle R - p."""
    if estimator.oracle:
        return rewards - success_prob
    token_level_rewards = torch.from_numpy(rewards.reshape(-1, 1).astype(np.float32))
    mask = torch.ones_like(token_level_rewards, dtype=torch.int64)
    advantages = offline.compute_advantages(token_level_rewards, mask, uids, estimator.algorithm,
                                            cluster_ids=cluster_ids, prompt_keys=keys)  # fmt: skip
    return advantages[:, -1].numpy().astype(np.float64)


def check_arms() -> None:
    """The lab runs exactly the regime's arms, at their rollouts a prompt."""
    if set(LAB_ARMS) != set(regime.IN_LABS) or any(LAB_ARMS[k].n != a.n for k, a in regime.IN_LABS.items()):
        raise AssertionError(f"LAB_ARMS {sorted(LAB_ARMS)} do not match instruments.regime.IN_LABS "
                             f"{sorted(regime.IN_LABS)}")
