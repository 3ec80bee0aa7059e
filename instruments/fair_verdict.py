"""The fair verdict's plan (results/fair_verdict.md, issue 56), declared once: which arms, in which order, on which
seeds, and where each kind of run keeps its state in the repository. The runner (scripts/fair_verdict.py) and the
report (scripts/fair_verdict_report.py) both read it; nothing here runs anything.

State, under ``results/regime/`` (what ``scripts/run_state.py save`` keeps: results, metrics, group records):

    lr_tuning/<arm>_n<n>/lr_<x>/runs/<arm>_n<n>_seed<s>/     tuning runs (seeds 100, 101), one folder per rate
    lr_tuning/<arm>_n<n>/choice.json                         the procedure's choice (instruments/tuning.py)
    own_lr/<arm>_n<n>/lr_<x>/runs/<arm>_n<n>_seed<s>/        judged runs at the arm's own rate (seeds 0-4)
    pretrained_lm_runs/comparison/runs/...                   the committed comparison at 2e-5 (GRPO's old rate)
    cold_start/selection/steps_<k>/runs/grpo_n8_seed<s>/     the cold start's selection runs (seeds 100, 101)
    cold_start/selection.json                                the selection's decision (instruments/cold_start.py)
    cold_start/arms/<arm>_n<n>/lr_<x>/runs/<arm>_n<n>_seed<s>/  the cold start's judged runs (seeds 0-4)
    launches.jsonl                                           the runner's launches, one line each (campaign.py)

One comparison folder per arm and rate: a comparison's runs share one learning rate and one settings key. The runner
runs each comparison in the same folder under its ``--out`` (``<out>/lr_tuning/grpo_n8/lr_1e-05``, ...).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGIME = ROOT / "results" / "regime"
TUNING = REGIME / "lr_tuning"
OWN_LR = REGIME / "own_lr"
COMMITTED = REGIME / "pretrained_lm_runs" / "comparison"  # every arm at 2e-5: counts where an arm chooses 2e-5
COMMITTED_LR = 2e-5
COLD = REGIME / "cold_start"
COLD_SELECTION = COLD / "selection"
COLD_ARMS_STATE = COLD / "arms"  # <arm>_n<n>/lr_<x>/runs/, as OWN_LR
REPORT = ROOT / "results" / "fair_verdict"  # the generated report and its plots (the design is fair_verdict.md)
CHOICE_FILE = "choice.json"
SELECTION_FILE = "selection.json"  # in COLD: the cold start's selection, decided
# The pretrained-LM comparison's settings (its steps; every tuning and judged run on the wide task keeps them but the
# rate), and its validation every 10 steps (at 0, 10, 20) and 4 samples a held-out prompt
SETTINGS = REGIME / "pretrained_lm_settings.json"
WIDE_TEST_FREQ = 10
VAL_SAMPLES = 4

# The commits every fair-verdict run must descend from (results/journal.md names them): the design, fair_verdict.md,
# fixed before any of its runs, and its amendments, each before the runs it concerns. The report's provenance table
# checks each run's commits against them (git merge-base --is-ancestor).
DESIGN_COMMIT = "9b8da05"
AMENDMENT_COMMITS = {"amendment 1": "b9f88c9", "amendment 2": "2161c46"}

REFERENCE = "grpo:8"
# Each core arm at its own rate, tuned in this order: GRPO first (its rate is the cold start's), BV-Blend n = 8 last
# (the first cut if compute runs out: it then runs at GRPO's rate).
TUNED_ARMS = ("grpo:8", "reinforce_plus_plus:1", "bv_blend:2", "bv_blend:8")
CUT_FIRST = "bv_blend:8"
# The cold start's arms (the package's lever last); an arm without a rate of its own runs at GRPO's.
COLD_ARMS = ("grpo:8", "bv_blend:8", "bv_blend:2", "reinforce_plus_plus:1", "grpo_dynamic:8",
             "bv_blend_sampler_epoch:2")
JUDGED_SEEDS = (0, 1, 2, 3, 4)
# The arms whose rate is another arm's: the history sampler's arm is BV-Blend's estimator at the same group size (its
# sampler draws which prompts; the update is the same), so it runs at BV-Blend n = 2's rate. Any other arm without a
# rate of its own (DAPO's dynamic sampling: GRPO n = 8 itself) runs at GRPO's.
SAME_RATE_AS = {"bv_blend_sampler_epoch:2": "bv_blend:2"}
# The arms stopped once their generated rollouts reach GRPO's (64 x steps): DAPO's dynamic sampling generates more
# than it trains on, and is read at GRPO's final rollouts, the budget (scripts/compare_cpu.py --stop-at-rollouts)
STOPPED_AT_ROLLOUTS = ("grpo_dynamic:8",)
COLD_STEPS = (20, 40)  # the selection's first length, and its one retry (fair_verdict.md, section 3)
COLD_TEST_FREQ = 5
ROLLOUTS_PER_STEP = 64


def arm_folder(arm: str) -> str:
    """``grpo:8`` -> ``grpo_n8``: the folder, and the run name's stem, of an arm at its group size."""
    name, sep, n = arm.partition(":")
    if not sep or not n.isdigit():
        raise ValueError(f"arm {arm!r} is not ARM:N (an arm of instruments.compare.arms.ARMS and its group size, "
                         "e.g. grpo:8)")
    return f"{name}_n{n}"


def lr_folder(lr: float) -> str:
    return f"lr_{lr:g}"


def run_folder(arm: str, seed: int) -> str:
    return f"{arm_folder(arm)}_seed{seed}"


def steps_folder(steps: int) -> str:
    """The cold start's selection at one length: ``steps_20``."""
    return f"steps_{steps}"
