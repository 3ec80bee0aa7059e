"""The cold start's task, accepted or not: the selection rule of results/fair_verdict.md, section 3, fixed before its
runs (issue 56).

GRPO n = 8 at its own learning rate runs the task ``cold`` on the two tuning seeds, first for the plan's first length
(20 steps, ``instruments/fair_verdict.py``, ``COLD_STEPS``); each run gives its held-out pass rate at step 0 (its
**start**, which no update has touched) and at its last step (its **final**). The rule reads the two seeds' means:

1. **Accepted** at a length if the mean start is at most :data:`START_MAX` (0.05) and the mean final at least
   :data:`GAIN` (3) times the mean start, and above it (see below).
2. If not, the same two runs are made at the plan's second length (40 steps, a pool of 64 x 40 = 2,560 prompts) and
   the same test is made on them alone.
3. If that fails too, there is **no cold start** for this model: an honest null. The report says so, and no other
   task is tried.

**"Gets off the ground" where the start is 0.** Three times a start of 0 is 0, which any final meets: read literally,
a task the model never solves at step 0 and still never solves at its last step would pass. The design's test is
that the task gets off the ground (fair_verdict.md: "at least three times its start"), so a final must also be above
its start: ``final > start``. Wherever the start is above 0, three times it is already above it and this adds
nothing; at a start of 0 it asks for at least one correct held-out sample at the end.

**Boundaries.** "At most" and "at least" include the bound. A pass rate is a count over 120 prompts x 4 samples
(a two-seed mean: a multiple of 1/960), so the bounds are read with a tolerance of :data:`TOLERANCE` (1e-9), far below
that resolution, only so that floating point does not turn an exact 0.15 = 3 x 0.05 into a failure.

Everything here is verl-free: the runs' readings in, the runs it needs next and its decision out. The plan's lengths
and seeds are passed in (``instruments/campaign.py`` passes ``fair_verdict.COLD_STEPS`` and ``tuning.TUNING_SEEDS``),
so that they are declared once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

START_MAX = 0.05  # the mean held-out start must be at most this: most groups all-wrong at the start
GAIN = 3.0  # the mean final must be at least this many times the mean start
TOLERANCE = 1e-9  # far below a pass rate's resolution (1/960 for a two-seed mean)


@dataclass(frozen=True)
class Reading:
    """One selection run's held-out pass rates: at step 0 and at its last step."""

    start: float
    final: float


# steps -> seed -> the reading of a finished selection run
Readings = Mapping[int, Mapping[int, Reading]]


@dataclass(frozen=True)
class Trial:
    """The rule's test at one length: the two seeds' mean start and final, and whether they pass."""

    steps: int
    start: float
    final: float
    passed: bool


@dataclass(frozen=True)
class Decision:
    """The selection's outcome: the accepted length (None: no cold start), and the test that decided it."""

    steps: int | None
    accepted: bool
    start: float  # the deciding trial's mean start (the last length tested)
    final: float  # and its mean final
    reason: str
    trials: tuple[Trial, ...]  # every length tested, in order


def passes(start: float, final: float) -> bool:
    """The rule's test on a mean start and final (module docstring: the bounds included, and a final above a start of
    0)."""
    return start <= START_MAX + TOLERANCE and final >= GAIN * start - TOLERANCE and final > start


def next_selection_runs(readings: Readings, lengths: Sequence[int], seeds: Sequence[int]) -> list[tuple[int, int]]:
    """The (steps, seed) runs the selection needs next, given the finished ones; empty once it can decide."""
    _check(lengths, seeds)
    for steps in lengths:
        missing = [(steps, seed) for seed in seeds if seed not in readings.get(steps, {})]
        if missing:
            return missing
        if _trial(readings, steps, seeds).passed:
            return []
    return []


def decide(readings: Readings, lengths: Sequence[int], seeds: Sequence[int]) -> Decision:
    """The selection's decision; refuses while it still needs runs."""
    missing = next_selection_runs(readings, lengths, seeds)
    if missing:
        raise ValueError("the cold start's selection is not finished: it still needs "
                         + ", ".join(f"{steps} steps seed {seed}" for steps, seed in missing))
    trials: list[Trial] = []
    for steps in lengths:
        trial = _trial(readings, steps, seeds)
        trials.append(trial)
        if trial.passed:
            return Decision(steps, True, trial.start, trial.final, f"accepted at {steps} steps: {_text(trial)}",
                            tuple(trials))
    last = trials[-1]
    tried = "; ".join(f"{t.steps} steps: {_text(t)}" for t in trials)
    return Decision(None, False, last.start, last.final, f"no cold start for this model ({tried})", tuple(trials))


def _trial(readings: Readings, steps: int, seeds: Sequence[int]) -> Trial:
    runs = [readings[steps][seed] for seed in seeds]
    start = sum(r.start for r in runs) / len(runs)
    final = sum(r.final for r in runs) / len(runs)
    return Trial(steps, start, final, passes(start, final))


def _text(trial: Trial) -> str:
    if trial.start > START_MAX + TOLERANCE:
        why = f"the mean start {trial.start:.4f} is above {START_MAX:g}"
    elif not trial.passed:
        why = (f"the mean final {trial.final:.4f} is not at least {GAIN:g} x the mean start {trial.start:.4f}"
               + (" and above it" if trial.start == 0 else ""))
    else:
        why = (f"the mean start {trial.start:.4f} is at most {START_MAX:g} and the mean final {trial.final:.4f} at "
               f"least {GAIN:g} x it")
    return why


def _check(lengths: Sequence[int], seeds: Sequence[int]) -> None:
    if not lengths or not seeds or len(set(lengths)) != len(lengths) or len(set(seeds)) != len(seeds):
        raise ValueError(f"the selection's lengths {list(lengths)} and seeds {list(seeds)} must be given, none twice")


__all__ = ["GAIN", "START_MAX", "TOLERANCE", "Decision", "Reading", "Readings", "Trial", "decide",
           "next_selection_runs", "passes"]
