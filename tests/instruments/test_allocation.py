"""The oracle allocation (instruments/allocation.py) against brute force, and its bad inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from instruments.allocation import knapsack_allocation, task_value


def brute_force(p: np.ndarray, budget: int, low: int, high: int) -> float:
    choices = [0, *range(low, high + 1)]
    values = [sum(task_value(n, q) for n, q in zip(combo, p, strict=True))
              for combo in itertools.product(choices, repeat=len(p)) if sum(combo) == budget]
    return float(max(values))


@pytest.mark.parametrize("seed", range(6))
def test_the_allocation_spends_the_budget_and_is_optimal(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = rng.uniform(0, 1, 4)
    p[0] = rng.choice([0.0, 1.0, p[0]])
    allocation = knapsack_allocation(p, budget=10, low=2, high=6)
    assert allocation.sum() == 10
    assert all(n == 0 or 2 <= n <= 6 for n in allocation)
    assert float(task_value(allocation, p).sum()) == pytest.approx(brute_force(p, 10, 2, 6), abs=1e-6)


def test_hard_prompts_get_more_rollouts_than_easy_ones() -> None:
    # value(N, p) grows with N most where p is small: Knapsack RL moves budget from easy to hard prompts
    allocation = knapsack_allocation(np.array([0.95, 0.9, 0.1, 0.05]), budget=16, low=2, high=16)
    assert allocation[2:].sum() > allocation[:2].sum()


def test_a_budget_below_the_largest_group_is_spent_too() -> None:
    allocation = knapsack_allocation(np.array([0.5, 0.2, 0.9, 0.7]), budget=8, low=2, high=16)
    assert allocation.sum() == 8 and all(n == 0 or 2 <= n <= 8 for n in allocation)


def test_worthless_prompts_share_what_is_left_evenly() -> None:
    # p = 0 or 1 is worth nothing: the tie-break spreads the budget instead of piling it on one prompt
    allocation = knapsack_allocation(np.array([0.0, 1.0, 0.0, 1.0]), budget=8, low=2, high=8)
    assert allocation.tolist() == [2, 2, 2, 2]


@pytest.mark.parametrize(("p", "budget", "message"), [
    (np.array([0.5, 1.5]), 4, "success rates in \\[0, 1\\]"),
    (np.array([0.5, 0.5]), 40, "cannot be split"),
    (np.array([0.5, 0.5]), 1, "cannot be split"),
])
def test_bad_input_is_a_clear_error(p: np.ndarray, budget: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        knapsack_allocation(p, budget, low=2, high=8)
