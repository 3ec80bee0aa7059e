"""The oracle allocation of issue 29: a step's rollouts split over its prompts by their true success rate p,
Knapsack-style (Knapsack RL, arXiv 2509.25849, "Knapsack-GRPO").

A limit, not a method: it knows the true p, which no run does. Both labs call this one function.

Each prompt of the step is an item; giving it N rollouts is worth

    value(N, p) = P(the group is not all equal) * InfoGain(p) = (1 - p^N - (1 - p)^N) * p (1 - p)^2

(the paper's task value for GRPO, with its approximation InfoGain(p) ~ p (1 - p)^2), and costs N. A prompt gets 0
rollouts (it is skipped this step and, in the no-revisit regime, never seen) or between ``low`` and ``high``; the
allocation spends exactly the step's budget and maximises the total value, by dynamic programming over the budget.
Where values tie (several prompts with p = 0 or 1 are worth nothing), a small concave bonus in N spreads the rest
evenly instead of leaving the choice to the loop's order.
"""

from __future__ import annotations

import numpy as np

TIE_BREAK = 1e-9


def task_value(n: np.ndarray | int, p: np.ndarray | float) -> np.ndarray:
    """Knapsack RL's value of ``n`` rollouts on a prompt with success rate ``p``."""
    n, p = np.asarray(n, dtype=np.float64), np.asarray(p, dtype=np.float64)
    return (1.0 - p**n - (1.0 - p) ** n) * p * (1.0 - p) ** 2


def knapsack_allocation(p: np.ndarray, budget: int, low: int = 2, high: int = 16) -> np.ndarray:
    """Rollouts per prompt (ints, summing to ``budget``), each 0 or in [low, high], maximising the summed value."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or len(p) == 0 or not np.all((p >= 0) & (p <= 1)):
        raise ValueError(f"p must be a non-empty 1-d array of success rates in [0, 1], got {p!r}")
    if not 1 <= low <= high:
        raise ValueError(f"need 1 <= low <= high, got low={low}, high={high}")
    if budget < 0 or budget > len(p) * high or 0 < budget < low:
        raise ValueError(f"a budget of {budget} rollouts cannot be split over {len(p)} prompts with 0 or "
                         f"{low}..{high} each: use a budget of 0 or between {low} and {len(p) * high}")
    choices = np.array([0, *range(low, high + 1)])
    gain = task_value(choices[None, :], p[:, None]) + TIE_BREAK * np.sqrt(choices)[None, :]
    # best[b]: the largest value of the prompts so far with exactly b rollouts spent (-inf: cannot be spent)
    best = np.full(budget + 1, -np.inf)
    best[0] = 0.0
    picks = np.zeros((len(p), budget + 1), dtype=np.int64)
    for i in range(len(p)):
        candidates = np.full((len(choices), budget + 1), -np.inf)
        for j, n in enumerate(choices[choices <= budget]):
            candidates[j, n:] = best[: budget + 1 - n] + gain[i, j]
        picks[i] = choices[candidates.argmax(0)]
        best = candidates.max(0)
    if not np.isfinite(best[budget]):
        raise ValueError(f"no allocation of 0 or {low}..{high} rollouts per prompt sums to {budget} over {len(p)} "
                         "prompts")
    allocation = np.zeros(len(p), dtype=np.int64)
    remaining = budget
    for i in range(len(p) - 1, -1, -1):
        allocation[i] = picks[i, remaining]
        remaining -= allocation[i]
    return allocation
