"""The settings the ``select`` suite freezes: selection.py's rules applied to its runs, as the JSON the full suite
reads (instruments/lab/token/frozen.json)."""

from __future__ import annotations

from typing import Any

import numpy as np

from instruments.lab.token import selection
from instruments.lab.token.arms import REFERENCE
from instruments.lab.token.runner import SuiteResults, final_values


def frozen_settings(results: SuiteResults) -> dict[str, Any]:
    """``lr`` and ``steps`` by the rules, with the sweep's table; raises if a selection run is missing."""
    suite = results.suite
    missing = [lr for lr in suite.lrs if not results.complete(REFERENCE, lr)]
    if missing:
        raise ValueError(f"the selection's runs at lr {missing} are not all finished: run the select suite again")
    finals = {lr: final_values(results.runs(REFERENCE, lr)) for lr in suite.lrs}
    lr = selection.choose_lr(finals)
    steps = results.runs(REFERENCE, lr)[0].eval_steps
    curve = np.mean([r.pass_rate for r in results.runs(REFERENCE, lr)], axis=0)
    every, horizon = suite.settings.eval_every, suite.settings.steps
    table = []
    for rate in suite.lrs:
        runs = results.runs(REFERENCE, rate)
        table.append({"lr": rate, "seeds": [r.seed for r in runs], "final": finals[rate],
                      "mean_final": float(np.mean(finals[rate])),
                      "mean_start": float(np.mean([r.pass_rate[0] for r in runs])),
                      "eval_steps": runs[0].eval_steps,
                      "mean_curve": [float(v) for v in np.mean([r.pass_rate for r in runs], axis=0)]})
    runs = [r for rate in suite.lrs for r in results.runs(REFERENCE, rate)]
    return {
        "lr": lr,
        "steps": selection.choose_steps(steps, curve, every, horizon),
        "selection": {
            "arm": REFERENCE,
            "seeds": list(suite.seeds),
            "lrs": list(suite.lrs),
            "steps": horizon,
            "eval_every": every,
            "eval_samples": suite.settings.eval_samples,
            "table": table,
            "still_improving": {str(t): selection.still_improving(steps, curve, t)
                                for t in range(4 * every, horizon + 1, 4 * every)},
            # what a run of GRPO n=8 cost here: the full suite's time projection scales it
            "cpu_seconds_per_run": float(np.mean([r.info.get("cpu_seconds", np.nan) for r in runs])),
            "wall_seconds_per_run": float(np.mean([r.train_seconds + r.eval_seconds for r in runs])),
            "eval_seconds_per_run": float(np.mean([r.eval_seconds for r in runs])),
        },
    }
