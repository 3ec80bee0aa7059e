"""The suites of ``scripts/lab_token.py``: select (point 3 of issue 22), then full and quick.

- ``select``: GRPO n=8 alone, 4 learning rates around the stand-in's 1e-4, on seeds 100-102 (not the comparison's),
  at the longest run that fits the full suite's time budget; selection.py's rule, written before it ran, picks the
  learning rate and the step count, which go to frozen.json beside this file.
- ``full``: every arm of arms.ARMS at the frozen learning rate and step count, seeds 0-9 paired by seed; its report
  is results/token_lab/lab_token.md. ``--lr-sweep`` adds the three-point learning-rate check (x0.5, x1, x2) for the reference
  and for the arm that comes out best.
- ``quick``: the same arms, 3 seeds x 40 steps, fewer held-out samples: a smoke check of a few minutes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from instruments.lab.token.arms import ARM_TABLES, ARMS, REFERENCE, REGIME_ARMS, TokenArm
from instruments.lab.token.run import LabSettings

FROZEN = Path(__file__).with_name("frozen.json")
LR_SWEEP_FACTORS = (0.5, 2.0)  # with x1 (the comparison itself): the three-point check of point 3
COMPARISON_SEEDS = tuple(range(10))
SELECTION_SEEDS = (100, 101, 102)
SELECTION_LRS = (5e-5, 1e-4, 2e-4, 4e-4)
# The longest run for which the full suite (9 arms x 10 seeds, 2 worker processes) fits in 2 hours on 2 cores,
# fixed before the selection from the stand-in's costs (~0.3 s a training step of 64 rollouts, ~2.4 s an evaluation
# of 120 x 8: ~110 s a run). Measured in the selection: ~79 s of CPU a run. The selection's rule then chose 80 steps,
# at which a run costs ~45 s: the comparison first took 20 seeds, then went back to 10 (seeds 0-9, the issue's
# minimum) while the reference was running, because on the shared machine a run cost twice that (frozen.json).
MAX_STEPS = 200
STANDIN_LR = 1e-4
FULL_EVAL_EVERY = 5


@dataclass(frozen=True)
class Suite:
    name: str
    settings: LabSettings
    arms: tuple[str, ...]  # keys of arms.ARMS; the reference first
    seeds: tuple[int, ...]
    lrs: tuple[float, ...]  # one for a comparison; the swept ones for ``select``
    report: str = ""  # the default report path; "" is DIR/lab_token.md
    catalog: str = "comparison"  # the table its arms come from (arms.ARM_TABLES)
    lr_check_seeds: tuple[int, ...] = ()  # the learning-rate check's seeds; () is every seed of the suite

    @property
    def lr(self) -> float:
        return self.lrs[0]

    @property
    def sweep_seeds(self) -> tuple[int, ...]:
        return self.lr_check_seeds or self.seeds

    def seeds_at(self, lr: float) -> tuple[int, ...]:
        return self.seeds if lr in self.lrs else self.sweep_seeds

    @property
    def table(self) -> dict[str, TokenArm]:
        return ARM_TABLES[self.catalog]

    @property
    def no_revisit(self) -> bool:
        """The regime's suites promise that no prompt is drawn twice (results/regime.md)."""
        return self.catalog == "regime"

    def check(self) -> None:
        """Raises ValueError, before any run starts, for settings its arms cannot use; a no-revisit suite whose pool
        is smaller than steps x the most prompts an arm takes a step (a prompt would come back) is refused."""
        arms = [self.table[key] for key in self.arms]
        self.settings.check(arms)
        if not self.no_revisit or not arms:
            return
        settings = self.settings
        widest = max(arms, key=lambda arm: arm.prompts_per_step(settings.budget))
        most = widest.prompts_per_step(settings.budget)
        if settings.pool_size < settings.steps * most:
            raise ValueError(
                f"suite {self.name}: {widest.label} draws {most} prompts a step, {settings.steps} steps x {most} = "
                f"{settings.steps * most} prompts, but the pool holds {settings.pool_size}: a prompt would come back "
                f"in a no-revisit suite. Raise pool_size to at least {settings.steps * most}, or lower steps to "
                f"{settings.pool_size // most}."
            )


def load_frozen(path: Path = FROZEN) -> dict[str, Any]:
    """The settings frozen by the selection (``lr``, ``steps`` and how they were chosen)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `scripts/lab_token.py --suite select --out DIR` first, which "
                                "writes DIR/frozen.json, and copy it there")
    return json.loads(path.read_text())


def select() -> Suite:
    settings = LabSettings(steps=MAX_STEPS)
    return Suite("select", settings, (REFERENCE,), SELECTION_SEEDS, SELECTION_LRS)


def full(frozen: dict[str, Any] | None = None) -> Suite:
    frozen = load_frozen() if frozen is None else frozen
    # every 5 steps (the selection: 10): evaluations do not move a run's training (run.py), and the crossing of
    # the reference's final value is read between evaluations
    settings = LabSettings(steps=int(frozen["steps"]), eval_every=FULL_EVAL_EVERY)
    return Suite("full", settings, tuple(ARMS), COMPARISON_SEEDS, (float(frozen["lr"]),), report="results/token_lab/lab_token.md")


def quick(frozen: dict[str, Any] | None = None) -> Suite:
    if frozen is None:
        frozen = load_frozen() if FROZEN.is_file() else {"lr": STANDIN_LR}
    settings = LabSettings(steps=40, eval_every=10, eval_samples=4)
    return Suite("quick", settings, tuple(ARMS), (0, 1, 2), (float(frozen["lr"]),))


# The no-revisit regime (issue 29, results/regime.md): the frozen learning rate and steps; the widened task, a pool of
# 80 x 64 = 5,120 problems walked once, the codebook's clusters, held-out evaluations every 10 steps (the full
# suite's 5 doubled the evaluations' cost, half of a run; evaluations do not move training, run.py).
REGIME_POOL = 5120
REGIME_EVAL_EVERY = 10
# The warm-up, fixed on the warmed-up model's held-out pass rate alone (no RL run read): the smallest of 800, 1600
# and 3200 steps whose start is at least 0.15 (the demo task's start: 0.187), else 3200. Written after 800 (0.031)
# and 1600 (0.115) had been measured and before 3200's result (regime_warmup.json beside this file).
REGIME_WARMUP_STEPS = 3200


# The learning-rate check's seeds, fixed at 05:56 UTC on 2026-12-02, before any learning-rate run, from the session's
# time alone (no result read): all ten if the x1 runs finish by 06:55 UTC, else seeds 0-4 (its 60 runs take about
# 30 min on 2 cores; half of them fit where all do not). The same seeds for every arm and factor, the reference's too.
REGIME_LR_CHECK_SEEDS = COMPARISON_SEEDS


def regime(frozen: dict[str, Any] | None = None) -> Suite:
    frozen = load_frozen() if frozen is None else frozen
    settings = LabSettings(steps=int(frozen["steps"]), eval_every=REGIME_EVAL_EVERY, pool_size=REGIME_POOL,
                           task="wide", clusters="codebook", warmup_steps=REGIME_WARMUP_STEPS)
    return Suite("regime", settings, tuple(REGIME_ARMS), COMPARISON_SEEDS, (float(frozen["lr"]),),
                 report="results/token_lab/token_lab.md", catalog="regime", lr_check_seeds=REGIME_LR_CHECK_SEEDS)


SUITES = {"quick": quick, "full": full, "select": select, "regime": regime}
