"""Rules that pick a comparison's settings from results, each written down (and committed) before the runs it reads.

Point 3 of issue 22, "no tuning to win": the learning rate and the step count are chosen on GRPO n=8 alone, on
seeds that are not the comparison's, before any other arm runs; the other arms get them unchanged.
scripts/pretrained_settings.py applies them to the pretrained-LM comparison's sweep (they were the token lab's, which
is retired: results/token_lab/README.md).

- **Learning rate**: of the swept rates, the one with the highest mean over the selection seeds of the final
  held-out pass rate (after the sweep's longest run); a tie to three decimals goes to the smaller rate.
- **Step count**: at that rate, the seed-mean curve c is *still improving at T* when the mean of c over the
  evaluations in (3T/4, T] exceeds its mean over (T/2, 3T/4] by at least a tenth of the gain c has made by then
  (the first of those means minus c(0)), and that gain is positive. T is the largest multiple of
  4 x eval_every up to the sweep's longest run at which c is still improving (the reference is not saturated at
  the end of the comparison, and its final value is a target other arms can be timed against), or that longest
  run if there is none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

IMPROVING_SHARE = 0.1


def choose_lr(final_by_lr: Mapping[float, Sequence[float]]) -> float:
    """The learning rate with the highest mean final pass rate (ties to 3 decimals: the smaller rate)."""
    return min(final_by_lr, key=lambda lr: (-round(float(np.mean(final_by_lr[lr])), 3), lr))


def still_improving(steps: Sequence[int], curve: Sequence[float], horizon: int) -> bool:
    """Whether the curve (values at ``steps``) is still improving at ``horizon`` (the rule above)."""
    steps_a, curve_a = np.asarray(steps), np.asarray(curve, dtype=np.float64)
    last = curve_a[(steps_a > 3 * horizon / 4) & (steps_a <= horizon)]
    before = curve_a[(steps_a > horizon / 2) & (steps_a <= 3 * horizon / 4)]
    if last.size == 0 or before.size == 0:
        return False
    gain = last.mean() - curve_a[0]
    return bool(gain > 0 and last.mean() - before.mean() >= IMPROVING_SHARE * gain)


def choose_steps(steps: Sequence[int], curve: Sequence[float], eval_every: int, max_steps: int) -> int:
    """The largest multiple of 4 x eval_every up to ``max_steps`` at which the curve is still improving."""
    candidates = range(4 * eval_every, max_steps + 1, 4 * eval_every)
    improving = [t for t in candidates if still_improving(steps, curve, t)]
    return max(improving) if improving else max_steps
