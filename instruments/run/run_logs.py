"""What a comparison run logged besides the demo's run summary (instruments/run/report.py), read from verl's metrics
and rollout dumps: the largest advantage, the time between steps, the sampler's and SPO's means, how often each prompt
was drawn, and what verl's dynamic sampling drew beyond the batch, with the rollouts a run generated in all.
instruments/compare/runs.py stores them in each run's result; the comparison's readers (compare_report, pairing,
no_revisit) read them back."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from bv_blend.core.jsonl import jsonl_records
from instruments.run import report

ADV_MAX, ADV_MIN = "critic/advantages/max", "critic/advantages/min"  # verl's, over the valid tokens of a step
OWN_ABS_MAX = ("bv_blend/abs_advantage_max",)  # an estimator's own, where verl's is missing
TESTING_TIME = "timing_s/testing"
SAMPLER_PREFIX = "sampler/"
ADVISOR_PREFIX = "advisor/"  # the start-time advisor's planned visits (arithmetic from the run's sizes)
SPO_P_HAT = "spo/p_hat_mean"  # SPO's mean p^ over a batch's prompts: what the sampler moves, with or without it
# Which estimators' "signal" (share of groups that get a non-zero advantage) the demo's reader defines. GRPO, HA-DW
# (GRPO's advantage reweighted) and MaxNorm-AC (zero on a group in one reward bin) give 0 exactly to the groups whose
# 0/1 scores all agree, so theirs is the share of the others, read from the groups' scores; BV-Blend logs its own.
# SPO gives every row r - p^, and at one rollout a prompt every group is all-equal: a share of groups says nothing.
SIGNAL_FROM_SCORES = ("grpo", "ha_dw", "maxnorm_ac")
SIGNAL_DEFINED = (*SIGNAL_FROM_SCORES, "bv_blend")


def max_abs_advantage(metrics: pd.DataFrame) -> float:
    """The largest |A| of any token of the run: verl's ``critic/advantages/max|min``, else the estimator's own."""
    train = report.training_steps(metrics)
    if ADV_MAX in train and ADV_MIN in train:
        return float(max(train[ADV_MAX].abs().max(), train[ADV_MIN].abs().max()))
    own = [train[c].max() for c in OWN_ABS_MAX if c in train]
    return float(max(own)) if own else float("nan")


def between_steps_s(metrics: pd.DataFrame, rollout_dir: Path, resumed_from: Sequence[int] = ()) -> float:
    """Mean wall time a step spends outside verl's step timer and its validation, from the rollout dump's times.

    verl's V1 trainer (the one the CPU harness runs, trainer/ppo/v1/trainer_base.py ``fit``) times ``step`` from
    fetching the step's batch (``prepare_step``: the history sampler's draw) to the actor update, then validates
    (``timing_s/testing``), computes the step's metrics, dumps its rollouts (``rollouts/<step>.jsonl``) and logs. So
    between the dumps of steps k and k+1 lie the logging of step k, step k+1, its validation and its metrics; this
    subtracts the two timed parts, leaving what no timer of verl covers. The dump is written by verl's one-thread
    executor, a few milliseconds after it is handed over: a mean over steps is exact to about that. The gap after
    step 1 is left out (step 2 of a run is still warming up vLLM's and the agent loop's first-use paths), and so is
    the gap after each step a resumed run restarted from (it spans the interruption and a whole start-up).
    """
    times = {int(p.stem): p.stat().st_mtime for p in rollout_dir.glob("*.jsonl") if p.stem.isdigit()}
    train = report.training_steps(metrics)
    gaps = []
    for k in sorted(times):
        if k < 2 or k in resumed_from or k + 1 not in times or k + 1 not in train.index:
            continue
        testing = train.at[k + 1, TESTING_TIME] if TESTING_TIME in train else float("nan")
        gaps.append(times[k + 1] - times[k] - train.at[k + 1, report.STEP_TIME]
                    - (0.0 if math.isnan(testing) else testing))
    return float(np.mean(gaps)) if gaps else float("nan")


def extra_summary(metrics: pd.DataFrame, rollout_dir: Path, resumed_from: Sequence[int] = ()) -> dict[str, float]:
    """The comparison's numbers beyond the demo's run summary: max |A|, the advantage step's time, the time between
    steps, and the means over training steps of the sampler's and SPO's logged metrics (absent when not logged)."""
    train = report.training_steps(metrics)
    steady = train.iloc[1:] if len(train) > 1 else train  # step 1 holds vLLM's first-use costs
    out = {
        "max |A|": max_abs_advantage(metrics),
        "adv time ms": 1000 * float(steady[report.ADV_TIME].mean()) if report.ADV_TIME in steady else float("nan"),
        "between steps s": between_steps_s(metrics, rollout_dir, resumed_from),
    }
    for column in sorted(c for c in train.columns if c.startswith((SAMPLER_PREFIX, ADVISOR_PREFIX)) or c == SPO_P_HAT):
        out[column] = float(train[column].mean())
    return out


def visits_per_prompt(rollout_dir: Path) -> dict[str, float]:
    """How often the run drew each prompt, counted in verl's rollout dump (``rollouts/<step>.jsonl``): a draw is one
    sample of a step's batch (the dump's ``uid`` is ``<sample>_<session>_<output>``: one group), a prompt its text as
    verl sent it. ``max`` and ``mean`` visits over the drawn prompts, ``prompts`` drawn, ``draws`` in all. A dump
    without uids counts a prompt once a step (a prompt drawn twice in one batch would then count once)."""
    draws: dict[str, set[tuple[int, str]]] = {}
    for path in sorted(rollout_dir.glob("*.jsonl")):
        if not path.stem.isdigit():
            continue
        for row in jsonl_records(path):
            sample = row["uid"].rsplit("_", 2)[0] if "uid" in row else ""
            draws.setdefault(row["input"], set()).add((int(row.get("step", path.stem)), sample))
    if not draws:
        raise ValueError(f"{rollout_dir} holds no rollout dump: the visits per prompt cannot be counted")
    visits = np.array([len(d) for d in draws.values()], dtype=float)
    return {"max": float(visits.max()), "mean": float(visits.mean()), "prompts": float(len(visits)),
            "draws": float(visits.sum())}


# verl's dynamic sampling (algorithm.filter_groups) logs what it drew beyond the batch: kept with the result, so that
# its arm is judged at the rollouts it generated (results/regime.md, the pretrained-LM comparison)
FILTER_GROUPS_PREFIX = "training/filter_groups/"



def filter_groups_of(metrics: pd.DataFrame) -> dict:
    """Per step, what verl's dynamic sampling logged (``training/filter_groups/*``); nothing for other runs."""
    columns = [c for c in metrics.columns if c.startswith(FILTER_GROUPS_PREFIX)]
    if not columns:
        return {}
    steps = report.training_steps(metrics)[columns]
    return {"filter_groups": {c[len(FILTER_GROUPS_PREFIX):]: {str(int(step)): float(v) for step, v in
                                                               steps[c].dropna().items()} for c in columns}}


def generated_rollouts(result: dict, steps: Sequence[int]) -> np.ndarray:
    """The rollouts a run generated up to each of ``steps``: its batch's n x prompts a step, plus the groups verl's
    dynamic sampling drew beyond it (``training/filter_groups/evicted_samples`` and ``discarded_surplus_samples``,
    kept per step in the result by filter_groups_of; none logged at a step: none drawn), n rollouts each.

    Despite their names, verl counts those two in prompt groups (``len(dapo_uids)``, ``len(surplus_uids)`` in its
    sync ReplayBuffer), not rollouts: tests/bv_blend/verl/test_v1_advantage_step.py holds them to verl's own buffer."""
    spec, drawn = result["spec"], result.get("filter_groups", {})
    extra = {int(step): 0.0 for step in range(1, max(steps) + 1)}
    for name in ("evicted_samples", "discarded_surplus_samples"):
        for step, groups in drawn.get(name, {}).items():
            extra[int(step)] = extra.get(int(step), 0.0) + groups * spec["n"]
    per_step = np.array([spec["n"] * spec["batch"] + extra[step] for step in range(1, max(steps) + 1)])
    cumulative = np.concatenate([[0.0], np.cumsum(per_step)])
    return cumulative[np.asarray(steps, dtype=int)]
