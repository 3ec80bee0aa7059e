"""The prompt sampler's weights and draws (history_spec 5), verl-free: spend rollouts where the history says there
is something to learn.

Prompt p is drawn with probability proportional to ``sqrt(p^ (1 - p^)) + eps`` (SPO's recipe, ``EXPLORATION_EPSILON =
0.05``): largest near p^ = 0.5, where a rollout teaches most; prompts that are always or never solved get eps and so
still come back. A batch is ``k`` distinct prompts drawn from the whole training set without replacement; with the
epoch option (:func:`draw_from_remaining`) it is drawn from the prompts not yet drawn in the epoch instead.
"""

from __future__ import annotations

import numpy as np

EXPLORATION_EPSILON = 0.05


def prompt_weights(p_hat: np.ndarray, epsilon: float = EXPLORATION_EPSILON) -> np.ndarray:
    """(P,) sqrt(p^ (1 - p^)) + epsilon for each prompt's estimated success rate p^ in [0, 1]."""
    p_hat = np.clip(np.asarray(p_hat, dtype=np.float64), 0.0, 1.0)
    return np.sqrt(p_hat * (1.0 - p_hat)) + epsilon


def draw(weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` distinct prompt indices, drawn in proportion to ``weights`` without replacement."""
    weights = np.asarray(weights, dtype=np.float64)
    if not 1 <= k <= weights.size:
        raise ValueError(f"A batch of {k} distinct prompts cannot be drawn from {weights.size}.")
    return rng.choice(weights.size, size=k, replace=False, p=weights / weights.sum())


def draw_from_remaining(weights: np.ndarray, k: int, drawn: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``k`` distinct prompt indices among those not yet ``drawn`` (a boolean mask over the prompts), in proportion to
    ``weights`` without replacement (history_spec 5, "Without replacement over an epoch").

    It is :func:`draw` restricted to the remaining prompts, so each index follows the weights among the prompts neither
    drawn earlier in the epoch nor earlier in this batch (successive draws), and the first batch of an epoch is the
    one :func:`draw` would give from the same RNG.
    """
    weights, drawn = np.asarray(weights, dtype=np.float64), np.asarray(drawn)
    if drawn.dtype != np.bool_ or drawn.shape != weights.shape:
        raise ValueError(f"The drawn mask must be a boolean array of the weights' shape {weights.shape}; it is a "
                         f"{drawn.dtype} array of shape {drawn.shape}.")  # fmt: skip
    remaining = np.flatnonzero(~drawn)
    if k > remaining.size:
        raise ValueError(f"A batch of {k} distinct prompts cannot be drawn from the {remaining.size} not yet drawn "
                         "in this epoch.")  # fmt: skip
    return remaining[draw(weights[remaining], k, rng)]


def weight_entropy(weights: np.ndarray) -> float:
    """The entropy of the draw distribution relative to a uniform one, in [0, 1] (1: the weights are flat)."""
    probability = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    if probability.size < 2:
        return 1.0
    return float(-(probability * np.log(probability)).sum() / np.log(probability.size))


def zero_variance_expected(p_hat: np.ndarray, group_size: int) -> float:
    """The expected share of all-equal groups among prompts with success rates p^, at ``group_size`` rollouts each:
    mean of p^n + (1 - p^)^n."""
    p_hat = np.asarray(p_hat, dtype=np.float64)
    return float(np.mean(p_hat**group_size + (1.0 - p_hat) ** group_size)) if p_hat.size else 0.0


__all__ = ["EXPLORATION_EPSILON", "draw", "draw_from_remaining", "prompt_weights", "weight_entropy",
           "zero_variance_expected"]
