"""The learning-rate procedure (instruments/tuning.py), driven to its end on made-up score curves: what it runs
next, and what it chooses."""

from __future__ import annotations

import pytest

from instruments import tuning
from instruments.tuning import FIRST_SEED, MAX_LRS, SECOND_SEED, START_LRS


def drive(curve, seed_offset: float = 0.0) -> tuple[tuning.Choice, list[tuple[float, int]]]:
    """Runs the procedure to its end, each run's final given by ``curve(lr)`` (+ ``seed_offset`` on the second
    seed); returns the choice and every run in the order the procedure asked for it."""
    finals: dict[float, dict[int, float]] = {}
    asked = []
    for _ in range(50):
        runs = tuning.next_runs(finals)
        if not runs:
            return tuning.choose(finals), asked
        assert len(set(runs)) == len(runs) and not any(seed in finals.get(lr, {}) for lr, seed in runs)
        asked += runs
        for lr, seed in runs:
            finals.setdefault(lr, {})[seed] = curve(lr) + (seed_offset if seed == SECOND_SEED else 0.0)
    raise AssertionError("the procedure did not end")


def peaked_at(peak: float):
    import math

    return lambda lr: 0.7 - 0.1 * abs(math.log2(lr / peak))


def test_an_interior_best_takes_the_start_grid_on_both_seeds():
    choice, asked = drive(peaked_at(2e-5))
    assert choice.lr == 2e-5 and not choice.at_edge
    assert sorted(asked) == sorted((lr, seed) for lr in START_LRS for seed in (FIRST_SEED, SECOND_SEED))
    assert asked[:3] == [(lr, FIRST_SEED) for lr in START_LRS]  # the first seed everywhere before the second


@pytest.mark.parametrize("peak", [8e-5, 1.6e-4, 5e-6, 2.5e-6])
def test_the_grid_doubles_until_the_best_is_interior(peak):
    choice, asked = drive(peaked_at(peak))
    assert choice.lr == pytest.approx(peak) and not choice.at_edge
    lrs = sorted({lr for lr, _ in asked})
    assert lrs[0] < choice.lr < lrs[-1]  # interior of everything tried
    assert all(b == pytest.approx(2 * a) for a, b in zip(lrs[:-1], lrs[1:], strict=True))  # the grid only doubles
    two_seeds = [lr for lr in lrs if (lr, SECOND_SEED) in asked]
    assert two_seeds[0] < choice.lr < two_seeds[-1]  # interior among the two-seed stretch too
    assert choice.grid == tuple(lrs)


def test_a_best_beyond_the_cap_runs_at_the_edge_and_says_so():
    choice, asked = drive(lambda lr: lr)  # better the larger, without end
    lrs = sorted({lr for lr, _ in asked})
    assert len(lrs) == MAX_LRS and choice.lr == lrs[-1] and choice.at_edge


def test_the_second_seed_can_move_the_choice_outward():
    """Seed 100 peaks at 2e-5, but the second seed is far better at larger rates: the two-seed best is then at the
    stretch's upper end, so the stretch grows until it is interior."""
    def curve(lr):
        return peaked_at(2e-5)(lr)

    finals: dict[float, dict[int, float]] = {}
    for _ in range(50):
        runs = tuning.next_runs(finals)
        if not runs:
            break
        for lr, seed in runs:
            bonus = 0.3 if seed == SECOND_SEED and lr >= 4e-5 else 0.0  # the second seed rewards large rates
            finals.setdefault(lr, {})[seed] = curve(lr) + bonus
    choice = tuning.choose(finals)
    assert choice.lr == 4e-5 and not choice.at_edge
    both = sorted(choice.scores)
    assert both == [1e-5, 2e-5, 4e-5, 8e-5]  # 8e-5 joined the stretch on both seeds
    assert both[0] < choice.lr < both[-1]


def test_ties_go_to_the_smaller_rate():
    choice, _ = drive(lambda lr: 0.5 if lr in (1e-5, 2e-5) else 0.4)
    assert choice.lr == 1e-5


def test_choosing_before_the_end_is_refused_with_what_is_missing():
    with pytest.raises(ValueError, match="lr 1e-05 seed 100"):
        tuning.choose({2e-5: {FIRST_SEED: 0.6}})
