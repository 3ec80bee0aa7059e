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

from instruments.allocation import knapsack_allocation
from instruments.demo.standin import StandinSettings, held_out_pass_rates, policy_gradient_step, sample, warmed_up_model
from instruments.demo.task import Problem, families_of, held_out_problems
from instruments.lab.token import assets
from instruments.lab.token.advantages import TokenAdvantages, oracle_baseline
from instruments.lab.token.arms import TokenArm
from instruments.lab.token.pool import PromptOrder, sampled_prompts, training_pool

SIGNAL_THRESHOLD = 1e-6  # a row "has signal" when |A| exceeds this
KNAPSACK_LOW, KNAPSACK_HIGH = 2, 16  # rollouts a prompt under the limits' allocation: 0 or 2..16 (addendum)


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
    task: str = "demo"  # instruments/demo/task.TASKS; "wide" for the no-revisit regime
    clusters: str = "family"  # each prompt's cluster: its family, or the package's codebook of the pool ("codebook")
    num_clusters: int = 5  # K of the codebook (the families: 5)
    # extra responses a prompt that estimate p for the limits (not rollouts): an m-sample estimate, not the true p
    oracle_samples: int = 8
    prior_samples: int = 8  # offline prior scores a pool prompt (SPO's offline_N)

    def eval_steps(self) -> list[int]:
        """Steps after which the held-out pass rate is measured: 0, every ``eval_every``, and the last."""
        return sorted({0, self.steps, *range(self.eval_every, self.steps + 1, self.eval_every)})

    def standin(self, cache: str) -> StandinSettings:
        return StandinSettings(warmup_steps=self.warmup_steps, format_share=self.format_share, seed=self.model_seed,
                               val_prompts=self.val_prompts, cache=cache, task=self.task)

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
        if self.clusters not in ("family", "codebook"):
            raise ValueError(f"clusters={self.clusters!r}: 'family' or 'codebook'")
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


def oracle_seed(seed: int, step: int) -> int:
    return 5_000_011 + 10_000 * seed + step


def held_out(settings: LabSettings) -> list[Problem]:
    return held_out_problems(settings.val_prompts, settings.model_seed, task=settings.task)


def pool_of(settings: LabSettings, val: list[Problem]) -> list[Problem]:
    return training_pool(settings.pool_size, settings.model_seed, {p.question for p in val}, task=settings.task)


def estimated_success(model, tokenizer, problems: list[Problem], settings: LabSettings, seed: int,
                      step: int) -> np.ndarray:  # fmt: skip
    """The limits' p^ of each prompt: the share of ``oracle_samples`` (m = 8) extra responses that pass, drawn under
    a seed of their own (they do not move the run's training stream, and no rollout is spent on them). An m-sample
    estimate of the current policy's p, not p: at m = 8 a prompt whose samples all agree gets p^ = 0 or 1, and the
    Knapsack allocation gives it no rollout, so both limits understate what a true p would give."""
    m = settings.oracle_samples
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(oracle_seed(seed, step))
        scores = sample(model, tokenizer, problems, m, settings.max_new_tokens).scores
    return scores.view(len(problems), m).float().mean(1).numpy()


def run(settings: LabSettings, arm: TokenArm, seed: int, lr: float, cache: str,
        on_step: Callable[[dict[str, Any]], None] | None = None) -> RunRecord:
    """Run ``arm`` from the cached warmed-up model; ``on_step`` (tests) sees each step's batch and advantages."""
    if arm.best_of:
        raise ValueError(f"{arm.label} is a derived arm: resolve it (runner.resolve_derived) before running it")
    val = held_out(settings)
    families = families_of(settings.task)
    model, tokenizer = warmed_up_model(settings.standin(cache), {p.question for p in val})
    pool = pool_of(settings, val)
    keys = np.array([p.question for p in pool])
    clusters = assets.load_clusters(settings, cache, pool)
    order, sampler_rng = PromptOrder(len(pool), seed), np.random.default_rng([seed, 1])
    priors = str(assets.priors_path(settings, cache)) if arm.priors else None
    pool_clusters = dict(zip(keys.tolist(), clusters.tolist(), strict=True))  # what a trainer reads from its files
    advantages = TokenAdvantages(arm, settings.num_clusters, priors, pool_clusters)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    k, n = arm.prompts_per_step(settings.budget), arm.n
    eval_at = set(settings.eval_steps())
    record = RunRecord(arm.key, seed, lr, [], [], {f: [] for f in families}, [], [], [], [], [0] * len(pool))

    def evaluate(step: int) -> None:
        tic = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(eval_seed(seed, step))
            rates = held_out_pass_rates(model, tokenizer, val, settings.eval_samples)
        record.eval_seconds += time.perf_counter() - tic
        record.eval_steps.append(step)
        record.pass_rate.append(rates["all"])
        for family in families:
            record.per_family[family].append(rates[family])

    cpu_start = time.process_time()  # CPU time: what the cost projections use on a shared machine
    torch.manual_seed(seed)
    evaluate(0)
    for step in range(1, settings.steps + 1):
        tic = time.perf_counter()
        chosen = sampled_prompts(advantages.algorithm, keys, clusters, k, sampler_rng) if arm.sampler else order.take(k)
        p_hat = (estimated_success(model, tokenizer, [pool[i] for i in chosen], settings, seed, step)
                 if arm.oracle else None)
        sizes = np.full(len(chosen), n)
        if arm.oracle == "allocation":
            sizes = knapsack_allocation(p_hat, settings.budget, KNAPSACK_LOW, KNAPSACK_HIGH)
            chosen, p_hat, sizes = chosen[sizes > 0], p_hat[sizes > 0], sizes[sizes > 0]
            # a group of N_i rows is its prompt repeated N_i times, each sampled once (groups differ in size)
            repeated = [pool[i] for i, size in zip(chosen, sizes, strict=True) for _ in range(size)]
            rollouts = sample(model, tokenizer, repeated, 1, settings.max_new_tokens)
        else:
            rollouts = sample(model, tokenizer, [pool[i] for i in chosen], n, settings.max_new_tokens)
        rows = np.repeat(chosen, sizes)
        uids = np.repeat(np.array([f"{step}:{j}" for j in range(len(chosen))], dtype=object), sizes)
        toc = time.perf_counter()
        if arm.oracle == "baseline":
            adv = oracle_baseline(rollouts.scores, rollouts.response_mask, np.repeat(p_hat, sizes))
        else:
            adv = advantages(rollouts.scores, rollouts.response_mask, uids, clusters[rows], keys[rows])
        record.advantage_seconds += time.perf_counter() - toc
        if not torch.isfinite(adv).all():
            raise FloatingPointError(f"{arm.label}, seed {seed}, lr {lr}: non-finite advantages at step {step}")
        if on_step is not None:
            on_step({"step": step, "rollouts": rollouts, "uids": uids, "cluster_ids": clusters[rows],
                     "prompt_keys": keys[rows], "advantages": adv, "algorithm": advantages.algorithm})
        _record_step(record, rollouts.scores, adv, sizes)
        for i in chosen:
            record.visits[i] += 1
        policy_gradient_step(model, optimizer, rollouts, adv)
        record.train_seconds += time.perf_counter() - tic
        if step in eval_at:
            evaluate(step)
    record.info["cpu_seconds"] = time.process_time() - cpu_start
    return record


def _record_step(record: RunRecord, scores: torch.Tensor, advantages: torch.Tensor, sizes: np.ndarray) -> None:
    groups = torch.split(scores, sizes.tolist())
    record.reward.append(float(scores.float().mean()))
    record.all_equal.append(float(np.mean([bool((g == g[0]).all()) for g in groups])))
    abs_adv = advantages.abs()
    record.signal.append(float((abs_adv.amax(1) > SIGNAL_THRESHOLD).float().mean()))
    record.max_abs.append(float(abs_adv.max()))
