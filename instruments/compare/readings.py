"""The readings the fair verdict reports beside the judging rule's (results/fair_verdict.md, section 4), from what each
run keeps: its ``result.json`` (a dict), where present its verl metrics (``metrics.jsonl``) and its group record
(``groups.jsonl``, bv_blend/verl/group_record.py).

The rule judges one reading, the final held-out pass rate (``instruments/rule.py``). A verdict that rests on one
point of a three-point curve can flip with that point, so the field's other readings are reported beside it, each
as a paired difference to GRPO n = 8 with its 95% t-interval over seeds (``stats.paired_difference``), and none of
them judges:

- **final**: the validation at a run's last step (the rule's reading; :func:`rule_reading` makes it exactly as the
  committed summaries do, through ``pairing.pair``, so the two cannot disagree);
- **last two**: the mean of the last two validations, a final that one noisy validation moves half as much;
- **AUC**: the area under the held-out curve by trapezoids over the validation steps, divided by the steps it spans
  (fair_verdict.md, section 4): the mean pass rate over training, which rewards learning early;
- **DAPO's dynamic sampling three ways**: at equal generated rollouts (the rule's reading, ``pairing``), at equal
  steps (:func:`at_equal_steps`), at equal training wall time (:func:`at_equal_wall_time`, from verl's per-step
  ``timing_s/step``), since DAPO buys its kept groups with extra generation that a step count hides. In the cold
  start its runs stop once they have generated the reference's final rollouts (fair_verdict.md, amendment 1; the
  result's ``stopped`` record, instruments/compare/runs.py), each seed at its own step: :func:`pair` reads them at
  the budget all the same, and :func:`at_equal_steps` at the step each reached;
- **rollouts to reach GRPO's final** (``stats.reach_interval``, through ``pairing``);
- from the group record, by step: the shares of all-wrong and all-right groups (the groups GRPO learns nothing
  from), and for an arm with a history its lag behind the step's pass rate and its mean weight: the mechanism the
  paper credits BV-Blend's cold-start gain to, re-read from the repository.

A reading a run cannot give (no metrics kept, a validation missing) is ``None`` with the reason, never a number
made up to fill the cell. Everything here is arithmetic on dicts, frames and arrays; it runs no verl.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from instruments import regime, rule, stats
from instruments.compare import pairing
from instruments.compare.pairing import stopped_step, validation_curve
from instruments.run import report

Result = dict  # one run's result.json
Reading = Callable[[Result], float]

# A reward at or above it is a pass: with verl's 0/1 verifier an all-wrong group is one whose every reward is 0 and
# an all-right group one whose every reward is 1 (the threshold report.group_shares reads rollout dumps with).
PASS = 0.5
HISTORY_MEAN, HISTORY_WEIGHT = "history_mean", "history_weight"  # what a history arm writes per group


# ------------------------------------------------------------------------------------------ one run's readings
def final(result: Result) -> float:
    """The validation at the run's last validated step: the rule's reading (a run stopped at its rollout budget has it
    at the step it stopped at, not at its settings' steps: never read ``validation[steps]``)."""
    steps, values = validation_curve(result)
    if not len(steps):
        raise ValueError("the run has no validation")
    return float(values[-1])


def last_two_mean(result: Result) -> float:
    """The mean of the run's last two validations (steps 10 and 20 in the comparison's schedule)."""
    _, values = validation_curve(result)
    if len(values) < 2:
        raise ValueError(f"the run has {len(values)} validation(s); the last-two mean needs two")
    return float(values[-2:].mean())


def auc(result: Result) -> float:
    """The area under the held-out curve, trapezoids between validations, divided by the steps it spans (the last
    validated step minus the first, 20 from step 0): a mean pass rate over training, on the curve's own scale."""
    steps, values = validation_curve(result)
    if len(steps) < 2:
        raise ValueError(f"the run has {len(steps)} validation(s); an area needs two")
    return float(np.trapezoid(values, steps) / (steps[-1] - steps[0]))


READINGS: dict[str, Reading] = {"final": final, "last two": last_two_mean, "AUC": auc}
RULE_READING = "final"


# --------------------------------------------------------------------------------- paired with the reference
@dataclass(frozen=True)
class Difference:
    """A reading's paired difference, arm minus reference, on ``seeds``; ``interval`` is None where it cannot be read,
    and ``note`` says why (or what limits it: seeds left out)."""

    interval: stats.Interval | None
    seeds: tuple[int, ...]
    note: str = ""
    at_steps: tuple[int, ...] = ()  # where a reading is taken at a step per seed (at_equal_steps): that step, by seed


def paired(arm: Mapping[int, Result], reference: Mapping[int, Result], read: Reading) -> Difference:
    """``read`` of each seed's run minus the reference's, over the seeds both have, with the 95% t-interval."""
    seeds = tuple(sorted(set(arm) & set(reference)))
    if not seeds:
        return Difference(None, (), "no seed run by both")
    try:
        values = np.array([read(arm[s]) for s in seeds])
        base = np.array([read(reference[s]) for s in seeds])
    except ValueError as e:
        return Difference(None, seeds, str(e))
    return Difference(stats.paired_difference(values, base), seeds)


@dataclass(frozen=True)
class RuleReading:
    """The rule's reading of an arm against the reference: ``summary`` is what the committed summary holds (final,
    paired difference, rollouts to reach), ``verdict`` is the rule's only from ``rule.MIN_SEEDS`` paired seeds."""

    summary: regime.ArmSummary
    seeds: tuple[int, ...]
    verdict: str | None


def rule_reading(arm: Mapping[int, Result], reference: Mapping[int, Result]) -> RuleReading | None:
    """The rule's reading through ``pairing.pair`` (an arm that drew beyond its batch, or stopped at its
    budget, read at the reference's final generated rollouts); None where they share no seed or validation."""
    paired_runs = pairing.pair(arm, reference)
    if paired_runs is None:
        return None
    summary = paired_runs.reading()
    seeds = tuple(paired_runs.seeds)
    return RuleReading(summary, seeds, rule.verdict(summary.difference) if len(seeds) >= rule.MIN_SEEDS else None)


# ------------------------------------------------------------------------------------ DAPO, read three ways
def at_equal_steps(arm: Mapping[int, Result], reference: Mapping[int, Result]) -> Difference:
    """Per seed, the arm after as many optimizer steps as the reference, whatever it generated to fill them: its
    validation at the reference's final step minus the reference's final. A run stopped at its rollout budget
    (fair_verdict.md, amendment 1) never reached that step; it is read at the step it stopped at instead: its final
    validation (verl validates at the step it stops at) minus the reference's held-out curve at that same step, linear
    between the reference's validations. ``at_steps`` gives each seed's step, and the note says where they are not
    the reference's final."""
    seeds = tuple(sorted(set(arm) & set(reference)))
    if not seeds:
        return Difference(None, (), "no seed run by both")
    values, base, at, problems = [], [], [], []
    for s in seeds:
        ref_steps, ref_values = validation_curve(reference[s])
        own_steps, own_values = validation_curve(arm[s])
        stop = stopped_step(arm[s])
        if stop is None:  # it trained all its steps: read at the reference's final step
            step = int(ref_steps[-1])
            if step not in own_steps:
                problems.append(s)
                continue
            values.append(float(own_values[list(own_steps).index(step)]))
            base.append(float(ref_values[-1]))
        else:
            step = stop
            if int(own_steps[-1]) != stop or not ref_steps[0] <= stop <= ref_steps[-1]:
                return Difference(None, seeds, f"seed {s} stopped at step {stop}, but its last validation is at step "
                                  f"{int(own_steps[-1])} and the reference's validations span steps "
                                  f"{int(ref_steps[0])}-{int(ref_steps[-1])}: no reading at that step")
            values.append(float(own_values[-1]))
            base.append(float(np.interp(stop, ref_steps, ref_values)))
        at.append(step)
    if problems:
        return Difference(None, seeds, f"seed(s) {problems} have no validation at the reference's final step")
    finals = {s: int(validation_curve(reference[s])[0][-1]) for s in seeds}
    early = [f"seed {s}: step {step}" for s, step in zip(seeds, at, strict=True) if step != finals[s]]
    note = ("at the step each stopped run reached, the reference's curve read there: " + ", ".join(early)
            if early else "")
    return Difference(stats.paired_difference(np.array(values), np.array(base)), seeds, note, tuple(at))


def training_clock(metrics: pd.DataFrame) -> pd.Series:
    """Seconds of training at the end of each step (0 at step 0), the sum of verl's ``timing_s/step`` (the step from
    fetching its batch to the actor's update; validation, timed apart as ``timing_s/testing``, is left out: both
    arms validate on the same schedule). Raises where a step's time is missing: a clock with a hole is no clock."""
    train = report.training_steps(metrics)
    if train.empty:
        raise ValueError(f"the metrics hold no {report.STEP_TIME}")
    steps = {int(step) for step in train.index}
    holes = sorted(set(range(1, max(steps) + 1)) - steps)
    if holes:
        raise ValueError(f"the metrics lack {report.STEP_TIME} for step(s) {holes}")
    seconds = train[report.STEP_TIME].astype(float).sort_index()
    clock = pd.concat([pd.Series([0.0], index=[0]), seconds.cumsum()])
    clock.index = clock.index.astype(int)
    return clock


def curve_at_time(result: Result, clock: pd.Series, seconds: float) -> float | None:
    """The run's held-out pass rate after ``seconds`` of training, linear between its validations placed on its own
    clock; None past its last validation (a run that ended sooner is not extrapolated)."""
    steps, values = validation_curve(result)
    missing = [s for s in steps if s not in clock.index]
    if missing:
        raise ValueError(f"the clock has no time for validated step(s) {missing}")
    times = clock.loc[steps].to_numpy(dtype=float)
    if seconds > times[-1] or seconds < times[0]:
        return None
    return float(np.interp(seconds, times, values))


def at_equal_wall_time(arm: Mapping[int, Result], reference: Mapping[int, Result],
                       arm_metrics: Mapping[int, pd.DataFrame | None],
                       reference_metrics: Mapping[int, pd.DataFrame | None]) -> Difference:
    """Per seed, the arm's held-out curve read at the reference's training time to its final validation, minus that
    final. Only seeds whose two runs kept their metrics and ran on the same kind of CPU count (a second on another
    machine is not the same second); the note names every seed left out and why."""
    left_out: list[str] = []
    values, base, seeds = [], [], []
    for s in sorted(set(arm) & set(reference)):
        if arm_metrics.get(s) is None or reference_metrics.get(s) is None:
            who = " and ".join(name for name, m in (("the arm", arm_metrics), ("the reference", reference_metrics))
                               if m.get(s) is None)
            left_out.append(f"seed {s}: no metrics kept by {who}")
            continue
        if arm[s].get("cpu") != reference[s].get("cpu"):
            left_out.append(f"seed {s}: the two runs ran on different CPUs")
            continue
        try:
            ref_clock, arm_clock = training_clock(reference_metrics[s]), training_clock(arm_metrics[s])
            ref_steps, ref_values = validation_curve(reference[s])
            budget = float(ref_clock.loc[ref_steps[-1]])
            read = curve_at_time(arm[s], arm_clock, budget)
        except (KeyError, ValueError) as e:
            left_out.append(f"seed {s}: {e}")
            continue
        if read is None:
            left_out.append(f"seed {s}: the arm's training ended before the reference's {budget:.0f} s")
            continue
        seeds.append(s)
        values.append(read)
        base.append(float(ref_values[-1]))
    note = "; ".join(left_out)
    if not seeds:
        return Difference(None, (), note or "no seed run by both")
    return Difference(stats.paired_difference(np.array(values), np.array(base)), tuple(seeds), note)


# ------------------------------------------------------------------------------------------- the group record
def read_groups(path: Path) -> pd.DataFrame:
    """A group record as a frame, one row per prompt group. A resumed run appends the steps it ran again after the
    ones already there (group_record.py): of a step written twice, only its last block of lines is kept."""
    groups = pd.read_json(path, lines=True)
    if groups.empty:
        raise ValueError(f"{path} holds no group")
    block = (groups["step"] != groups["step"].shift()).cumsum()
    last = block.groupby(groups["step"]).transform("max")
    return groups[block == last].reset_index(drop=True)


def _rewards(groups: pd.DataFrame) -> pd.Series:
    return groups["rewards"].map(lambda r: np.array([np.nan if v is None else v for v in r], dtype=float))


def group_shares(groups: pd.DataFrame) -> pd.DataFrame:
    """Per step: the prompt groups, and the shares of them that are all-wrong (every reward 0), all-right (every
    reward 1) and mixed; the first two give GRPO no signal. The three shares sum to 1."""
    rewards = _rewards(groups)
    frame = pd.DataFrame({
        "step": groups["step"].astype(int),
        "all-wrong": rewards.map(lambda r: bool((r < PASS).all())),
        "all-right": rewards.map(lambda r: bool((r >= PASS).all())),
    })
    frame["mixed"] = ~(frame["all-wrong"] | frame["all-right"])
    by_step = frame.groupby("step")
    out = by_step[["all-wrong", "all-right", "mixed"]].mean()
    out.insert(0, "groups", by_step.size())
    return out


def has_history(groups: pd.DataFrame) -> bool:
    """Whether the record carries a history's mean (an estimator with a history wrote it: BV-Blend)."""
    return HISTORY_MEAN in groups and groups[HISTORY_MEAN].notna().any()


def history_by_step(groups: pd.DataFrame) -> pd.DataFrame:
    """Per step: the pass rate (the mean reward of all the step's rollouts), the history's lag (the mean over the
    step's groups of the history mean their advantages used minus that pass rate: below zero, the history still
    holds the model as weaker than it is) and the history's mean weight. Empty for an arm without a history."""
    columns = ["pass rate", "lag", "weight", "groups with history"]
    if not has_history(groups):
        return pd.DataFrame(columns=columns, index=pd.Index([], name="step", dtype=int))
    rewards = _rewards(groups)
    totals = pd.DataFrame({"step": groups["step"].astype(int), "sum": rewards.map(np.nansum),
                           "count": rewards.map(lambda r: int(np.isfinite(r).sum()))}).groupby("step").sum()
    pass_rate = totals["sum"] / totals["count"]
    steps = groups["step"].astype(int)
    lag = (groups[HISTORY_MEAN] - steps.map(pass_rate)).groupby(steps).mean()
    weight = (groups[HISTORY_WEIGHT] if HISTORY_WEIGHT in groups else pd.Series(np.nan, index=groups.index))
    out = pd.DataFrame({"pass rate": pass_rate, "lag": lag, "weight": weight.groupby(steps).mean(),
                        "groups with history": groups[HISTORY_MEAN].notna().groupby(steps).sum()})
    out.index.name = "step"
    return out


def seed_mean_by_step(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The mean over seeds of per-step frames (each run's :func:`group_shares` or :func:`history_by_step`), with
    ``seeds``: how many runs had the step."""
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    stacked = pd.concat(frames)
    out = stacked.groupby(level=0).mean(numeric_only=True)
    out["seeds"] = stacked.groupby(level=0).size()
    return out


__all__ = ["PASS", "READINGS", "RULE_READING", "Difference", "RuleReading", "at_equal_steps", "at_equal_wall_time",
           "auc", "curve_at_time", "final", "group_shares", "has_history", "history_by_step", "last_two_mean",
           "paired", "read_groups", "rule_reading", "seed_mean_by_step", "stopped_step", "training_clock",
           "validation_curve"]
