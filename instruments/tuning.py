"""Each arm's own learning rate: one procedure for every arm, fixed before its runs (issue 56; results/regime.md,
"Each arm at its own learning rate").

The pretrained-LM comparison ran every arm at GRPO's learning rate, the largest of the three its sweep tried. Here
each core arm gets its own, by the same rules, on tuning seeds that no judged run uses, at the comparison's settings
(20 steps of 64 rollouts, the wide task, no prompt twice, held-out validation at steps 0, 10 and 20):

1. **The grid doubles.** It starts at :data:`START_LRS` (half, one and two times the comparison's 2e-5).
2. **Score** of a learning rate on some seeds: the mean of their final held-out pass rates (step 20), the reading
   the judging rule reads (``instruments/rule.py``). Ties go to the smaller learning rate.
3. **Phase 1, the first tuning seed.** Every learning rate of the grid runs on seed :data:`FIRST_SEED`. While the best
   is the largest (smallest) one tried, the grid grows by twice the largest (half the smallest).
4. **Phase 2, both tuning seeds.** The best of phase 1 and its two neighbours in the grid also run on
   :data:`SECOND_SEED`. Among the learning rates run on both seeds (always a contiguous stretch of the grid), the
   best by the two-seed score must be interior; while it is at an end, the stretch grows on that side by one
   learning rate (run on both seeds).
5. **The choice** is phase 2's interior best. A grid that reaches :data:`MAX_LRS` learning rates with its best still
   at an end stops there, and the arm runs at that end, reported as "at the edge of its grid".

The judged runs then run each arm at its choice on seeds 0-4, judged by ``instruments/rule.py`` as committed; a
comparison run that already ran at the chosen rate with the same code, dtype and settings counts.

Everything here is verl-free: finals in, the next runs and the choice out (``scripts/tune_lr.py`` runs them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

START_LRS = (1e-5, 2e-5, 4e-5)
FIRST_SEED, SECOND_SEED = 100, 101  # tuning seeds: the judged runs use 0-4
TUNING_SEEDS = (FIRST_SEED, SECOND_SEED)
MAX_LRS = 6  # 1/8 to 8 times a start would be out of reach; six doublings span 32x, beyond any sensible rate here

# lr -> seed -> final held-out pass rate of a finished tuning run
Finals = Mapping[float, Mapping[int, float]]


@dataclass(frozen=True)
class Choice:
    """The procedure's outcome for one arm."""

    lr: float
    at_edge: bool  # the grid reached MAX_LRS with its best at an end
    scores: dict[float, float]  # the two-seed score of every learning rate run on both seeds
    grid: tuple[float, ...]  # every learning rate tried


def next_runs(finals: Finals) -> list[tuple[float, int]]:
    """The (lr, seed) runs the procedure needs next, given the finished ones; empty once it has chosen."""
    grid = _grid(finals)
    needed = [(lr, FIRST_SEED) for lr in grid if FIRST_SEED not in finals.get(lr, {})]
    if needed:
        return needed
    best = _best(grid, finals, (FIRST_SEED,))
    grown = _grown(grid, best)
    if grown is not None:
        return [(grown, FIRST_SEED)]
    stretch = _stretch(grid, finals, best)
    needed = [(lr, SECOND_SEED) for lr in stretch if SECOND_SEED not in finals.get(lr, {})]
    if needed:
        return needed
    both = _run_on_both(grid, finals)
    best = _best(both, finals, TUNING_SEEDS)
    outward = _outward(grid, both, best)
    if outward is None:
        return []
    return [(outward, seed) for seed in TUNING_SEEDS if seed not in finals.get(outward, {})]


def choose(finals: Finals) -> Choice:
    """The arm's learning rate; refuses while the procedure still needs runs."""
    missing = next_runs(finals)
    if missing:
        raise ValueError(f"the procedure is not finished: it still needs {_runs_text(missing)}")
    grid = _grid(finals)
    both = _run_on_both(grid, finals)
    best = _best(both, finals, TUNING_SEEDS)
    scores = {lr: _score(finals, lr, TUNING_SEEDS) for lr in both}
    return Choice(best, best in (both[0], both[-1]), scores, tuple(grid))


# ------------------------------------------------------------------------------------------------- the rules
def _grid(finals: Finals) -> list[float]:
    """Every learning rate started or finished, ascending (the start grid always belongs)."""
    return sorted(set(START_LRS) | {float(lr) for lr in finals})


def _score(finals: Finals, lr: float, seeds: tuple[int, ...]) -> float:
    return sum(finals[lr][seed] for seed in seeds) / len(seeds)


def _best(lrs: list[float], finals: Finals, seeds: tuple[int, ...]) -> float:
    """The highest score; ties go to the smaller learning rate (``lrs`` ascending)."""
    return max(lrs, key=lambda lr: (_score(finals, lr, seeds), -lr))


def _grown(grid: list[float], best: float) -> float | None:
    """Phase 1: the learning rate that extends the grid past its best at an end, or None when the best is interior
    (or the grid is full)."""
    if len(grid) >= MAX_LRS:
        return None
    if best == grid[-1]:
        return _exact(grid[-1] * 2)
    if best == grid[0]:
        return _exact(grid[0] / 2)
    return None


def _stretch(grid: list[float], finals: Finals, best: float) -> list[float]:
    """Phase 2's learning rates: phase 1's best and its neighbours, and every one already run on both seeds (the
    stretch only grows)."""
    i = grid.index(best)
    around = grid[max(i - 1, 0) : i + 2]
    return sorted(set(around) | set(_run_on_both(grid, finals)))


def _run_on_both(grid: list[float], finals: Finals) -> list[float]:
    return [lr for lr in grid if all(seed in finals.get(lr, {}) for seed in TUNING_SEEDS)]


def _outward(grid: list[float], both: list[float], best: float) -> float | None:
    """While the two-seed best is at an end of the stretch run on both seeds: the next learning rate beyond that end,
    from the grid or a new doubling; None when the best is interior, or the grid is full."""
    if best not in (both[0], both[-1]):
        return None
    upward = best == both[-1]
    beyond = [lr for lr in grid if (lr > both[-1] if upward else lr < both[0])]
    if beyond:
        return beyond[0] if upward else beyond[-1]
    if len(grid) >= MAX_LRS:
        return None
    return _exact(both[-1] * 2 if upward else both[0] / 2)


def _exact(lr: float) -> float:
    """A doubled or halved rate, written as the command line will print it (2 x 4e-05 is 8e-05, not 8.000000001e-05)."""
    return float(f"{lr:.6g}")


def _runs_text(runs: list[tuple[float, int]]) -> str:
    return ", ".join(f"lr {lr:g} seed {seed}" for lr, seed in runs)


__all__ = ["FIRST_SEED", "MAX_LRS", "SECOND_SEED", "START_LRS", "TUNING_SEEDS", "Choice", "choose", "next_runs"]
