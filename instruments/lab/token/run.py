"""One run of the token-level lab: the warmed-up demo model, ``steps`` RL steps of one arm, held-out evaluations.

A step, as the stand-in does it (instruments/demo/standin.py) and verl does it with one PPO mini-batch and one epoch:
take the step's prompts (pool.py), sample n responses each at T=1 (HF ``generate``, at most 16 new tokens),
score them with the demo's verifier, compute the advantages with verl's estimator (advantages.py), and take one
AdamW step on verl's token-mean policy-gradient loss with the gradient clipped at 1.0.

Randomness: the seed fixes the prompt order (its own numpy stream) and the response sampling (torch's stream).
Evaluations run under ``torch.random.fork_rng`` with a seed of their own, made of (seed, step) only: they do not
move the training stream (how often a run is evaluated does not change its training), and every arm of a seed is
evaluated on the same random numbers at the same step (the paired differences lose that part of the noise).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from instruments.demo.standin import StandinSettings, held_out_pass_rates, policy_gradient_step, sample, warmed_up_model
from instruments.demo.task import FAMILIES, held_out_problems
from instruments.lab.token.advantages import TokenAdvantages
from instruments.lab.token.arms import TokenArm
from instruments.lab.token.pool import PromptOrder, sampled_prompts, training_pool

CLUSTER_OF_FAMILY = {family: k for k, family in enumerate(FAMILIES)}  # the 5 families are the 5 clusters
SIGNAL_THRESHOLD = 1e-6  # a row "has signal" when |A| exceeds this


@dataclass(frozen=True)
class LabSettings:
    """Everything common to the runs of a suite that determines their numbers (the arm, seed and lr aside)."""

    warmup_steps: int = 800  # the demo's warm-up (instruments/demo/pipeline.py)
    format_share: float = 0.5
    model_seed: int = 0  # the model, its warm-up, the held-out split and the training pool
    val_prompts: int = 120  # the demo's held-out prompts
    budget: int = 64  # rollouts a step, every arm
    steps: int = 200
    pool_size: int = 320
    eval_every: int = 10
    eval_samples: int = 8  # responses per held-out prompt at T=1
    max_new_tokens: int = 16  # the demo's data.max_response_length

    def eval_steps(self) -> list[int]:
        """Steps after which the held-out pass rate is measured: 0, every ``eval_every``, and the last."""
        return sorted({0, self.steps, *range(self.eval_every, self.steps + 1, self.eval_every)})

    def standin(self, cache: str) -> StandinSettings:
        return StandinSettings(warmup_steps=self.warmup_steps, format_share=self.format_share, seed=self.model_seed,
                               val_prompts=self.val_prompts, cache=cache)

    def check(self, arms: list[TokenArm]) -> None:
        """Raises ValueError, before any run starts, for settings the runs cannot use."""
        for arm in arms:
            if arm.n < 1 or self.budget % arm.n:
                raise ValueError(f"{arm.label}: a budget of {self.budget} rollouts a step is not a multiple of "
                                 f"n={arm.n}")
            k = arm.prompts_per_step(self.budget)
            if self.pool_size % k:
                raise ValueError(f"{arm.label}: the pool of {self.pool_size} prompts is not a multiple of its {k} "
                                 "prompts a step (a step would straddle two epochs)")
        if min(self.steps, self.eval_every, self.eval_samples, self.val_prompts, self.warmup_steps) < 1:
            raise ValueError(f"steps, eval_every, eval_samples, val_prompts and warmup_steps must be >= 1: {self}")


@dataclass
class RunRecord:
    """What a run measured; per-step lists have ``steps`` entries, evaluation lists one per ``eval_steps``."""

    arm: str
    seed: int
    lr: float
    eval_steps: list[int]
    pass_rate: list[float]  # held-out, over all responses
    per_family: dict[str, list[float]]
    reward: list[float]  # mean training score of the step's rollouts
    all_equal: list[float]  # share of the step's groups whose scores are all equal (all n, for n = 1)
    signal: list[float]  # share of the step's rows with |A| > SIGNAL_THRESHOLD
    max_abs: list[float]  # max |A| over the step's response tokens
    visits: list[int]  # times each pool prompt was trained on
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    advantage_seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        return cls(**data)


def eval_seed(seed: int, step: int) -> int:
    return 1_000_003 + 10_000 * seed + step


def run(settings: LabSettings, arm: TokenArm, seed: int, lr: float, cache: str,
        on_step: Callable[[dict[str, Any]], None] | None = None) -> RunRecord:
    """Run ``arm`` from the cached warmed-up model; ``on_step`` (tests) sees each step's batch and advantages."""
    if arm.best_of:
        raise ValueError(f"{arm.label} is a derived arm: resolve it (runner.resolve_derived) before running it")
    val = held_out_problems(settings.val_prompts, settings.model_seed)
    held_out = {p.question for p in val}
    model, tokenizer = warmed_up_model(settings.standin(cache), held_out)
    pool = training_pool(settings.pool_size, settings.model_seed, held_out)
    keys = np.array([p.question for p in pool])
    clusters = np.array([CLUSTER_OF_FAMILY[p.family] for p in pool])
    order, sampler_rng = PromptOrder(len(pool), seed), np.random.default_rng([seed, 1])
    advantages = TokenAdvantages(arm, len(FAMILIES))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    k, n = arm.prompts_per_step(settings.budget), arm.n
    eval_at = set(settings.eval_steps())
    record = RunRecord(arm.key, seed, lr, [], [], {f: [] for f in FAMILIES}, [], [], [], [], [0] * len(pool))

    def evaluate(step: int) -> None:
        tic = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(eval_seed(seed, step))
            rates = held_out_pass_rates(model, tokenizer, val, settings.eval_samples)
        record.eval_seconds += time.perf_counter() - tic
        record.eval_steps.append(step)
        record.pass_rate.append(rates["all"])
        for family in FAMILIES:
            record.per_family[family].append(rates[family])

    cpu_start = time.process_time()  # CPU time: what the cost projections use on a shared machine
    torch.manual_seed(seed)
    evaluate(0)
    for step in range(1, settings.steps + 1):
        tic = time.perf_counter()
        chosen = sampled_prompts(advantages.algorithm, keys, clusters, k, sampler_rng) if arm.sampler else order.take(k)
        rollouts = sample(model, tokenizer, [pool[i] for i in chosen], n, settings.max_new_tokens)
        rows = np.repeat(chosen, n)
        uids = np.repeat(np.array([f"{step}:{j}" for j in range(k)], dtype=object), n)
        toc = time.perf_counter()
        adv = advantages(rollouts.scores, rollouts.response_mask, uids, clusters[rows], keys[rows])
        record.advantage_seconds += time.perf_counter() - toc
        if not torch.isfinite(adv).all():
            raise FloatingPointError(f"{arm.label}, seed {seed}, lr {lr}: non-finite advantages at step {step}")
        if on_step is not None:
            on_step({"step": step, "rollouts": rollouts, "uids": uids, "cluster_ids": clusters[rows],
                     "prompt_keys": keys[rows], "advantages": adv, "algorithm": advantages.algorithm})
        _record_step(record, rollouts.scores, adv, n)
        for i in chosen:
            record.visits[i] += 1
        policy_gradient_step(model, optimizer, rollouts, adv)
        record.train_seconds += time.perf_counter() - tic
        if step in eval_at:
            evaluate(step)
    record.info["cpu_seconds"] = time.process_time() - cpu_start
    return record


def _record_step(record: RunRecord, scores: torch.Tensor, advantages: torch.Tensor, n: int) -> None:
    groups = scores.view(-1, n)
    record.reward.append(float(scores.float().mean()))
    record.all_equal.append(float((groups == groups[:, :1]).all(1).float().mean()))
    abs_adv = advantages.abs()
    record.signal.append(float((abs_adv.amax(1) > SIGNAL_THRESHOLD).float().mean()))
    record.max_abs.append(float(abs_adv.max()))
