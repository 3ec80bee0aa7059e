"""What each arm's mechanism did, read from verl's per-step metrics of a comparison's finished runs.

A held-out pass rate says which arm learned; it does not say why. verl logs, for every arm, the policy-gradient
loss and the score of the step's rollouts; each estimator of this package logs its own counters (HA-DW's anchor and
weights, MaxNorm-AC's scales, NTF's kept share of the negative tokens, BV-Blend's signal and weight). This module
averages them over a run's training steps, then over the arm's seeds, from the ``metrics.jsonl`` that
``scripts/run_state.py`` keeps beside each finished run's ``result.json``. A run whose metrics were lost (they were
kept only from 2026-12-05 on) counts in "runs" and not in "with metrics".
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pandas as pd

from instruments.compare.arms import ARMS, arm_label
from instruments.compare.runs import RESULT_FILE
from instruments.run import report
from instruments.run.resume import METRICS

# verl's own, logged for every arm: the update's loss and gradient norm, the rollouts' mean score and length (the
# clip fraction is left out: one on-policy update a step, bypass mode, never clips)
VERL_COLUMNS = ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean")
# the estimators' own counters (bv_blend/companions/*.py, bv_blend/blend/estimator.py); NTF's sit in the actor's
OWN_PREFIXES = ("bv_blend/", "ha_dw/", "maxnorm/", "actor/ntf/")


def is_own_counter(name: str) -> bool:
    return name.startswith(OWN_PREFIXES)


def run_means(run_dir: Path) -> pd.Series:
    """One run's mean over its training steps (a resumed run's attempts read as one) of verl's columns and the
    estimator's own counters."""
    train = report.training_steps(report.read_run_metrics(run_dir))
    columns = [c for c in train.columns if c in VERL_COLUMNS or is_own_counter(c)]
    return train[columns].mean()


def arm_means(runs_dir: Path) -> tuple[pd.DataFrame, dict[str, int]]:
    """Per arm (its label; in ARMS' order, then by n, largest first): the mean over its seeds of :func:`run_means`,
    with ``with metrics`` (how many of its runs kept their metrics); and per arm, how many finished runs it has."""
    if not runs_dir.is_dir():
        raise FileNotFoundError(f"{runs_dir} is not a folder: give a comparison's runs/ folder (its --out/runs, or "
                                "its state in results/regime/*_runs/<comparison>/runs)")
    means: dict[str, list[pd.Series]] = defaultdict(list)
    finished: dict[str, int] = defaultdict(int)
    specs = {p: json.loads((p / RESULT_FILE).read_text())["spec"] for p in runs_dir.iterdir()
             if (p / RESULT_FILE).is_file()}
    order = list(ARMS)
    for run_dir, spec in sorted(specs.items(), key=lambda item: (order.index(item[1]["arm"]), -item[1]["n"],
                                                                  item[1]["seed"])):
        label = arm_label(spec["arm"], spec["n"], spec["batch"])
        finished[label] += 1
        if (run_dir / METRICS).is_file():
            means[label].append(run_means(run_dir))
    table = pd.DataFrame({label: pd.concat(runs, axis=1).mean(axis=1) for label, runs in means.items()}).T
    table.insert(0, "with metrics", [len(means[label]) for label in table.index])
    return table, dict(finished)


def markdown(runs_dir: Path) -> str:
    """Two tables: verl's columns for every arm, then each estimator's own counters for the arms that log them."""
    table, finished = arm_means(runs_dir)
    if table.empty:
        return f"No finished run in {runs_dir} kept its metrics.\n"
    lines = ["| arm | runs | with metrics | " + " | ".join(c for c in VERL_COLUMNS if c in table) + " |"]
    lines.append("|---" * (3 + sum(c in table for c in VERL_COLUMNS)) + "|")
    for label, row in table.iterrows():
        cells = [f"{row[c]:+.3f}" if c == "actor/pg_loss" else f"{row[c]:.3f}" for c in VERL_COLUMNS if c in row]
        lines.append(f"| {label} | {finished[label]} | {int(row['with metrics'])} | " + " | ".join(cells) + " |")
    lines += ["", "| arm | its own counters (mean over steps, then seeds) |", "|---|---|"]
    for label, row in table.iterrows():
        own = [f"`{c}` {row[c]:.3f}" for c in table.columns if is_own_counter(c) and pd.notna(row[c])]
        if own:
            lines.append(f"| {label} | " + ", ".join(own) + " |")
    return "\n".join(lines) + "\n"
