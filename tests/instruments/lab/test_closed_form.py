"""Configurations whose outcome is known in closed form.

With the policy frozen (lr 0), the lab's policy gradient is an unbiased Monte-Carlo estimate of its expectation:

    E[grad] = (1 / P) sum_j c * p_j (1 - p_j) phi_j

(the style term has mean zero). c = 1 for the exact advantage R - p and for RLOO (an unbiased baseline), and
c = 1 - 1/G for Dr.GRPO (the group mean includes the row itself). The estimators run through verl's functions.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from instruments.lab.env import EnvConfig, Policy, Task, sigmoid
from instruments.lab.optim import Optimizer, OptimizerConfig
from tests.instruments.lab._helpers import traced

TINY = EnvConfig(
    num_clusters=2,
    prompts_per_cluster=4,
    prompts_per_step=8,  # every prompt every step
    group_size=4,
    feature_dim=5,
    difficulty_mean=0.0,
    difficulty_std=1.5,
    style_scale=1.0,
)
FROZEN = OptimizerConfig("sgd", lr=0.0, clip_grad_norm=None)
STEPS = 600


@pytest.mark.parametrize(("key", "factor"), [("oracle", 1.0), ("rloo", 1.0), ("drgrpo", 1.0 - 1.0 / TINY.group_size)])
def test_expected_policy_gradient_is_the_analytic_one(key, factor):
    grads = np.array([step["grad"] for step in traced(key, steps=STEPS, seed=0, env=TINY, optimizer=FROZEN)])
    task = Task(TINY, seed=0, steps=1)
    p = sigmoid(-task.base_difficulty)
    expected = factor * (p * (1.0 - p)) @ task.features / TINY.prompts_per_step
    mean, standard_error = grads.mean(axis=0), grads.std(axis=0, ddof=1) / np.sqrt(STEPS)

    def distance(target: np.ndarray) -> float:  # chi-square with D degrees of freedom if mean estimates target
        return float(np.sum(((mean - target) / standard_error) ** 2))

    chi2_999 = stats.chi2.ppf(0.999, df=TINY.feature_dim)
    assert distance(expected) < chi2_999, (mean, expected, standard_error)
    # The check has the power to reject a wrong constant: 1 - 1/G where it should be 1, or 1 where it should be 1 - 1/G.
    wrong = expected * (1.0 - 1.0 / TINY.group_size if factor == 1.0 else 1.0 / factor)
    assert distance(wrong) > 3 * chi2_999


def test_adam_first_step_after_the_clip_is_lr_times_the_sign():
    """Adam's first bias-corrected step is lr * g / (|g| + eps) per coordinate, whatever the clip did to g."""
    optimizer = Optimizer(OptimizerConfig("adam", lr=0.1, clip_grad_norm=1.0), num_params=2)
    np.testing.assert_allclose(optimizer.step(np.array([30.0, -40.0])), [0.1, -0.1], rtol=1e-6)


def test_sgd_clips_the_global_norm_like_torch():
    optimizer = Optimizer(OptimizerConfig("sgd", lr=0.5, clip_grad_norm=1.0), num_params=2)
    np.testing.assert_allclose(optimizer.step(np.array([3.0, -4.0])), 0.5 * np.array([0.6, -0.8]), rtol=1e-6)
    np.testing.assert_allclose(optimizer.step(np.array([0.3, 0.4])), [0.15, 0.2])  # below the clip: unchanged


def test_policy_gradient_is_the_derivative_of_the_weighted_log_likelihood():
    """Policy.gradient = d/d theta of mean_i A_i log pi(R_i, m_i), checked by central differences at a random theta."""
    task = Task(TINY, seed=7, steps=1)
    policy = Policy(task)
    policy.params = np.random.default_rng(0).normal(0.0, 0.7, policy.params.size)
    batch = task.sample(0, policy, sigmoid(policy.logits(task.difficulty(0))))
    advantages = np.random.default_rng(1).normal(size=batch.rewards.shape)

    def objective(params: np.ndarray) -> float:
        probe = Policy(task)
        probe.params = params
        p = sigmoid(probe.logits(task.difficulty(0)))[batch.prompts][:, None]
        log_success = np.where(batch.rewards == 1.0, np.log(p), np.log1p(-p))
        log_style = np.log(np.take_along_axis(probe.style_probs(batch.prompts), batch.styles, axis=1))
        return float(np.mean(advantages * (log_success + log_style)))

    step = 1e-6
    numeric = np.array(
        [(objective(policy.params + e) - objective(policy.params - e)) / (2 * step) for e in step * np.eye(5)]
    )
    np.testing.assert_allclose(policy.gradient(batch, advantages), numeric, rtol=1e-6, atol=1e-9)
