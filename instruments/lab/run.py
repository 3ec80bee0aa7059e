"""One simulated RLVR run: sample prompts and rollouts, compute advantages, take a policy-gradient step; repeat.

The step's prompts are drawn uniformly (pre-drawn from the seed), or, with a sampler, by the shipped weights
sqrt(p (1 - p)) + 0.05 of history_spec 5 (``bv_blend.history.sampler``): ``history`` reads p from the estimator's
history as verl's sampler does (``bv_blend.verl.offline.success_estimates``), ``oracle`` knows the true p (the limit of
what any sampler can do).

A step, as in verl with one PPO mini-batch and one epoch (on-policy, so the ratio is 1 and PPO's clip is inactive):

    p_j    = sigmoid(z_j)                          for the step's P prompts
    R_i    = 1[U_i < p_j(i)]                       G rollouts per prompt, U pre-drawn (coupled across estimators)
    A_i    = estimator(R, uids, clusters, keys)    verl's registered function (estimators.py)
    grad   = mean_i A_i (R_i - p_j(i)) dz_j(i)/dtheta   the exact score-function gradient, verl's token-mean loss
    theta += optimizer step (SGD, or Adam after a global gradient-norm clip)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from bv_blend.history.sampler import draw, prompt_weights
from instruments.lab.env import EnvConfig, Policy, Task, sigmoid
from instruments.lab.estimators import Advantages, EstimatorSpec
from instruments.lab.metrics import BiasSums
from instruments.lab.optim import Optimizer, OptimizerConfig

# A group "has signal" when one of its rows gets |A| above this (the estimator's effective signal).
SIGNAL_THRESHOLD = 1e-6
SAMPLERS = ("", "history", "oracle")


@dataclass(frozen=True)
class RunSpec:
    """Everything that determines a run's numbers."""

    estimator: EstimatorSpec
    env: EnvConfig = field(default_factory=EnvConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    codebook: str = "true"
    steps: int = 200
    seed: int = 0
    lr_scale: float = 1.0
    sampler: str = ""  # "" (uniform), "history" or "oracle"

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"RunSpec.sampler={self.sampler!r}: use one of {SAMPLERS}.")


@dataclass
class RunResult:
    """Per-step records of a run (arrays of length ``steps``, ``success`` has one more entry)."""

    success: np.ndarray  # expected success over all prompts, before each step and after the last
    signal_ratio: np.ndarray  # share of the step's groups with a non-zero advantage
    all_equal_ratio: np.ndarray  # share of the step's groups whose rewards are all equal (every group at G = 1)
    abs_advantage_max: np.ndarray
    grad_norm: np.ndarray  # before the clip
    update_norm: np.ndarray  # |delta theta|
    abs_advantage_p999: float
    nonfinite_step: int | None  # first step with a non-finite advantage (the run stopped there), else None
    bias: BiasSums
    estimator_seconds: float
    total_seconds: float


def run(spec: RunSpec, trace: list[dict[str, np.ndarray]] | None = None) -> RunResult:
    """Run ``spec`` from scratch (the estimator's history starts empty). ``trace`` collects every step's batch."""
    start = time.perf_counter()
    env, steps = spec.env, spec.steps
    task = Task(env, spec.seed, steps)
    cluster_of_prompt, num_clusters = task.codebook(spec.codebook)
    estimator = Advantages(spec.estimator, num_clusters)
    policy = Policy(task)
    optimizer = Optimizer(spec.optimizer, policy.params.size, spec.lr_scale)

    success = np.zeros(steps + 1)
    signal, all_equal, abs_max, grad_norm, update_norm = (np.zeros(steps) for _ in range(5))
    sampler_rng, keys = task.sampler_rng(), task.prompt_keys()
    abs_advantages = np.zeros((steps, env.rollouts_per_step))
    bias, estimator_seconds, nonfinite_step = BiasSums.empty(), 0.0, None
    for step in range(steps):
        success_prob = sigmoid(policy.logits(task.difficulty(step)))
        success[step] = success_prob.mean()
        prompts = None
        if spec.sampler:
            p_hat = success_prob if spec.sampler == "oracle" else estimator.success_estimates(keys, cluster_of_prompt)
            prompts = draw(prompt_weights(p_hat), env.prompts_per_step, sampler_rng)
        batch = task.sample(step, policy, success_prob, prompts)
        tic = time.perf_counter()
        advantages = estimator(batch.rewards, task.uids(step), cluster_of_prompt[batch.prompts], batch.success_prob,
                               keys[batch.prompts])  # fmt: skip
        estimator_seconds += time.perf_counter() - tic
        if not np.isfinite(advantages).all():  # a trainer would crash here: the run stops, its policy frozen
            nonfinite_step = step
            success[step + 1 :] = success[step]
            abs_max[step:] = np.inf
            break

        grad = policy.gradient(batch, advantages)
        update = optimizer.step(grad)
        policy.params += update

        abs_adv = np.abs(advantages)
        abs_advantages[step] = abs_adv.ravel()
        signal[step] = np.mean((abs_adv > SIGNAL_THRESHOLD).any(axis=1))
        all_equal[step] = np.mean(batch.rewards.min(axis=1) == batch.rewards.max(axis=1))
        abs_max[step] = abs_adv.max()
        grad_norm[step] = np.sqrt(grad @ grad)
        update_norm[step] = np.sqrt(update @ update)
        bias.add(batch.success_prob, batch.rewards, advantages)
        if trace is not None:
            trace.append(
                {
                    "prompts": batch.prompts,
                    "success_prob": batch.success_prob,
                    "rewards": batch.rewards,
                    "styles": batch.styles,
                    "uids": task.uids(step),
                    "cluster_ids": cluster_of_prompt[batch.prompts],
                    "prompt_keys": keys[batch.prompts],
                    "advantages": advantages,
                    "grad": grad,
                    "update": update,
                }
            )
    else:
        success[steps] = sigmoid(policy.logits(task.difficulty(steps))).mean()

    finished = steps if nonfinite_step is None else nonfinite_step
    return RunResult(
        success=success,
        signal_ratio=signal,
        all_equal_ratio=all_equal,
        abs_advantage_max=abs_max,
        grad_norm=grad_norm,
        update_norm=update_norm,
        abs_advantage_p999=float(np.quantile(abs_advantages[:finished], 0.999)) if finished else 0.0,
        nonfinite_step=nonfinite_step,
        bias=bias,
        estimator_seconds=estimator_seconds,
        total_seconds=time.perf_counter() - start,
    )
