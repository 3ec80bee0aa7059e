"""The simulated RLVR task: prompts in topic clusters of different difficulty, and a policy whose skill transfers.

Prompt j (of N) belongs to topic cluster c(j) (of C). The policy is logistic in the prompt's features: its success
probability is

    p_j = sigmoid(z_j),   z_j = theta . phi_j - d_j(t),   theta in R^D, 0 at the start

- features phi_j = beta_g f_0 + beta_c f_c(j) + beta_p f_j, with random directions f (entries N(0, 1/D)): what is
  learnt on one prompt transfers to the prompts of its cluster (shared f_c), partly to all prompts (shared f_0,
  beta_g < beta_c), and D < N makes prompts compete for capacity (their f_j overlap at random, so progress on one
  prompt can cost another, as in a network of finite size);
- difficulty d_j(t) = mu + a_c(j) + e_j + drift_c(j)(t), with a_c ~ N(0, rho sigma^2) and e_j ~ N(0, (1 - rho) sigma^2):
  rho is the share of the difficulty variance that the clusters explain, mu how hard the task is, and drift an
  optional random walk per cluster (non-stationary difficulty).

A response is a pair (R, m): whether it solves the prompt (R = 1) and its "style" m, one of M ways of writing it
that the verifier ignores, drawn from softmax_m(theta . psi_jm) with random style features psi (entries
N(0, nu^2 / D)). The log-probability of a response is log P(R) + log P(m), and its score function is exact:

    d log pi(R, m) / d theta = (R - p_j) phi_j + (psi_jm - sum_m' pi_jm' psi_jm')

The second term has mean zero and carries no information about the reward: it is the part of an LLM's
d log pi(y) that concerns the response's particular tokens. It is what a baseline exists to tame (an advantage
multiplies it, and it moves every prompt's logit at random through the shared theta); without it every sensible
estimator pushes each prompt the right way, and under Adam they all learned alike (results/lab.md, "Environment").

Every random number of a run is drawn up front from the seed, in separate streams: the task (features,
difficulties), the prompts of each step, the uniforms that decide each rollout (R = 1 iff U < p_j; the style by
inverse CDF) and the uids.
Estimators run on the same seed therefore see the same task, the same prompts and coupled rewards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Independent random streams of one seed (an added stream never changes the others).
_TASK, _PROMPTS, _UNIFORMS, _DRIFT, _CODEBOOK, _UIDS, _FEATURES, _STYLES, _SAMPLER = range(9)

CODEBOOKS = ("true", "global", "coarse", "fine", "random", "noisy")
# How many true clusters a "coarse" codebook merges, and into how many parts a "fine" one splits each.
COARSE_MERGE = 4
FINE_SPLIT = 4
# Share of prompts that a "noisy" codebook puts in a random cluster (an encoder that is often wrong).
NOISY_SHARE = 0.3


@dataclass(frozen=True)
class EnvConfig:
    """Settings of the simulated task and of the batch (prompts per step x group size)."""

    num_clusters: int = 16
    prompts_per_cluster: int = 64
    difficulty_mean: float = 1.5  # mu: how hard the task is, in logits against the initial skill 0
    difficulty_std: float = 2.5  # sigma: spread of prompt difficulty, in logits
    cluster_share: float = 0.5  # rho: share of the difficulty variance the clusters explain
    drift_std: float = 0.0  # per-step std of each cluster's difficulty random walk (0: stationary)
    feature_dim: int = 64  # D: the policy's capacity
    global_transfer: float = 0.5  # beta_g
    cluster_transfer: float = 1.0  # beta_c
    prompt_transfer: float = 1.0  # beta_p
    num_styles: int = 8  # M: ways of writing a response that the verifier ignores
    style_scale: float = 2.0  # nu: size of the reward-free part of the score function (0 turns it off)
    prompts_per_step: int = 16
    group_size: int = 8

    def __post_init__(self) -> None:
        counts = ("num_clusters", "prompts_per_cluster", "prompts_per_step", "group_size", "feature_dim", "num_styles")
        for name in counts:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EnvConfig.{name} must be a positive int, got {value!r}.")
        if not 0.0 <= self.cluster_share <= 1.0:
            raise ValueError(f"EnvConfig.cluster_share={self.cluster_share} must be in [0, 1] (a share of variance).")
        if min(self.difficulty_std, self.drift_std, self.style_scale) < 0:
            raise ValueError("EnvConfig.difficulty_std, drift_std and style_scale must be >= 0 (they are scales).")
        if self.prompts_per_step > self.num_prompts:
            raise ValueError(
                f"EnvConfig.prompts_per_step={self.prompts_per_step} exceeds the {self.num_prompts} prompts of the "
                "task: raise prompts_per_cluster or num_clusters."
            )

    @property
    def num_prompts(self) -> int:
        return self.num_clusters * self.prompts_per_cluster

    @property
    def rollouts_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


class Task:
    """One seed's task and every random number of a run of ``steps`` steps."""

    def __init__(self, config: EnvConfig, seed: int, steps: int) -> None:
        self.config, self.seed, self.steps = config, seed, steps
        c, n = config.num_clusters, config.num_prompts
        rng = _stream(seed, _TASK)
        self.cluster = np.repeat(np.arange(c), config.prompts_per_cluster)  # true topic cluster of each prompt
        cluster_difficulty = rng.normal(0.0, config.difficulty_std * math.sqrt(config.cluster_share), c)
        prompt_difficulty = rng.normal(0.0, config.difficulty_std * math.sqrt(1.0 - config.cluster_share), n)
        self.base_difficulty = config.difficulty_mean + cluster_difficulty[self.cluster] + prompt_difficulty
        rng = _stream(seed, _FEATURES)
        scale = 1.0 / math.sqrt(config.feature_dim)
        shared, topic, own = (rng.normal(0.0, scale, (size, config.feature_dim)) for size in (1, c, n))
        self.features = config.global_transfer * shared + config.cluster_transfer * topic[self.cluster]
        self.features += config.prompt_transfer * own
        self.style_features = rng.normal(0.0, config.style_scale * scale, (n, config.num_styles, config.feature_dim))

        rng = _stream(seed, _PROMPTS)
        self.prompts = np.stack([rng.choice(n, config.prompts_per_step, replace=False) for _ in range(steps)])
        self.uniforms = _stream(seed, _UNIFORMS).random((steps, config.prompts_per_step, config.group_size))
        self.style_uniforms = _stream(seed, _STYLES).random((steps, config.prompts_per_step, config.group_size))
        walk = _stream(seed, _DRIFT).normal(0.0, config.drift_std, (steps, c)) if config.drift_std > 0 else None
        # drift[t] is the offset of each cluster's difficulty at step t (0 at step 0).
        self.drift = None if walk is None else np.vstack([np.zeros((1, c)), np.cumsum(walk, axis=0)])
        # Random uuid-4-shaped uids, one per prompt and step (formatting uuid.UUID objects would cost more than
        # the rest of the environment).
        self._uid_hex = _stream(seed, _UIDS).bytes(16 * steps * config.prompts_per_step).hex()

    def difficulty(self, step: int) -> np.ndarray:
        """d_j(t) of every prompt at ``step`` (0 <= step <= steps)."""
        if self.drift is None:
            return self.base_difficulty
        return self.base_difficulty + self.drift[min(step, self.steps)][self.cluster]

    def sample(
        self, step: int, policy: Policy, success_prob: np.ndarray, prompts: np.ndarray | None = None
    ) -> Rollouts:
        """The step's rollouts: G per prompt, from the step's pre-drawn uniforms (``success_prob`` of all prompts).

        ``prompts``: the step's prompts when a sampler chose them; by default the pre-drawn uniform ones.
        """
        prompts = self.prompts[step] if prompts is None else prompts
        prob = success_prob[prompts]
        rewards = (self.uniforms[step] < prob[:, None]).astype(np.float64)
        style_probs = policy.style_probs(prompts)
        cumulative = np.cumsum(style_probs, axis=1)
        styles = (self.style_uniforms[step][:, :, None] > cumulative[:, None, :]).sum(axis=2)  # inverse CDF
        styles = np.minimum(styles, self.config.num_styles - 1)  # a cumulative sum that ends just below 1
        return Rollouts(prompts, prob, rewards, styles, style_probs)

    def uids(self, step: int) -> np.ndarray:
        """One uuid string per prompt of the step (verl makes them with uuid.uuid4()), deterministic in the seed."""
        count = self.config.prompts_per_step
        hexes = (self._uid_hex[32 * i : 32 * i + 32] for i in range(step * count, (step + 1) * count))
        return np.array([f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{h[16:20]}-{h[20:]}" for h in hexes], dtype=object)

    def sampler_rng(self) -> np.random.Generator:
        """The prompt sampler's own stream: its draws never move the other streams."""
        return _stream(self.seed, _SAMPLER)

    def prompt_keys(self) -> np.ndarray:
        """A stable key per prompt (history_spec 1), for the estimators with a per-prompt history."""
        return np.array([f"prompt-{j}" for j in range(self.config.num_prompts)], dtype=object)

    def codebook(self, scheme: str) -> tuple[np.ndarray, int]:
        """The estimator's cluster id for every prompt, and K, under a codebook ``scheme``:

        ``true`` (the topic clusters), ``global`` (K = 1: one running baseline), ``coarse`` (groups of
        COARSE_MERGE topics merged), ``fine`` (each topic split at random into FINE_SPLIT), ``random`` (K = C,
        ids unrelated to topic), ``noisy`` (topics, with NOISY_SHARE of the prompts in a random cluster).
        """
        c, n = self.config.num_clusters, self.config.num_prompts
        rng = _stream(self.seed, _CODEBOOK)
        if scheme == "true":
            return self.cluster.copy(), c
        if scheme == "global":
            return np.zeros(n, dtype=np.int64), 1
        if scheme == "coarse":
            return self.cluster // COARSE_MERGE, -(-c // COARSE_MERGE)
        if scheme == "fine":
            return self.cluster * FINE_SPLIT + rng.integers(0, FINE_SPLIT, n), c * FINE_SPLIT
        if scheme == "random":
            return rng.integers(0, c, n), c
        if scheme == "noisy":
            moved = rng.random(n) < NOISY_SHARE
            return np.where(moved, rng.integers(0, c, n), self.cluster), c
        raise ValueError(f"Unknown codebook scheme {scheme!r}: use one of {', '.join(CODEBOOKS)}.")


@dataclass
class Rollouts:
    """One step's batch: P prompts with G rollouts each."""

    prompts: np.ndarray  # (P,) prompt indices, distinct
    success_prob: np.ndarray  # (P,) p_j when sampled
    rewards: np.ndarray  # (P, G) 0/1
    styles: np.ndarray  # (P, G) style index of each response
    style_probs: np.ndarray  # (P, M)


class Policy:
    """The logistic policy of the module docstring, and its exact score-function gradient."""

    def __init__(self, task: Task) -> None:
        self.features, self.style_features = task.features, task.style_features
        self.params = np.zeros(task.features.shape[1])

    def logits(self, difficulty: np.ndarray) -> np.ndarray:
        """z_j of every prompt."""
        return self.features @ self.params - difficulty

    def style_probs(self, prompts: np.ndarray) -> np.ndarray:
        logits = self.style_features[prompts] @ self.params
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        return probs / probs.sum(axis=1, keepdims=True)

    def gradient(self, batch: Rollouts, advantages: np.ndarray) -> np.ndarray:
        """mean_i A_i d log pi(R_i, m_i) / d theta: the policy gradient of verl's token-mean loss with one token
        per response (on-policy, so PPO's ratio is 1 and its clip inactive)."""
        rows = advantages.size
        success_weight = (advantages * (batch.rewards - batch.success_prob[:, None])).sum(axis=1) / rows
        grad = success_weight @ self.features[batch.prompts]
        style_features = self.style_features[batch.prompts]  # (P, M, D)
        # sum_i A_i (psi_{j, m_i} - sum_m pi_jm psi_jm) = sum_{j, m} (A-weight of style m - A-sum * pi_jm) psi_jm
        num_prompts, num_styles = batch.style_probs.shape
        style_weight = np.zeros((num_prompts, num_styles))
        np.add.at(style_weight, (np.arange(num_prompts)[:, None], batch.styles), advantages)
        style_weight -= advantages.sum(axis=1, keepdims=True) * batch.style_probs
        grad += style_weight.ravel() @ style_features.reshape(num_prompts * num_styles, -1) / rows
        return grad


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow warning for large |z|


def _stream(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, *keys])
