"""GRPO vs BV-Blend on verl's stock trainer, on CPU, with a tiny locally built model (docs/cpu.md).

Make it longer or larger with --steps, --batch, --n, --warmup-steps, --layers, --hidden, --num-clusters.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bv_blend.demo.pipeline import DemoSettings, run_demo


def main() -> None:
    defaults = DemoSettings(work_dir=Path("demo_out"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", type=Path, default=defaults.work_dir, help="where every artefact goes")
    p.add_argument("--steps", type=int, default=defaults.steps, help="RL steps per method")
    p.add_argument("--batch", type=int, default=defaults.batch, help="prompts per step")
    p.add_argument("--n", type=int, default=defaults.n, help="rollouts per prompt")
    p.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps, help="supervised warm-up steps")
    p.add_argument("--num-clusters", type=int, default=defaults.num_clusters, help="codebook size K")
    p.add_argument("--layers", type=int, default=defaults.layers, help="transformer layers of the tiny model")
    p.add_argument("--hidden", type=int, default=defaults.hidden, help="hidden size (a multiple of 64)")
    p.add_argument("--seed", type=int, default=defaults.seed)
    a = p.parse_args()
    if a.hidden % 64:
        p.error(f"--hidden {a.hidden} must be a multiple of 64 (vLLM-CPU needs head_dim 64)")
    settings = DemoSettings(work_dir=a.work_dir, steps=a.steps, batch=a.batch, n=a.n, warmup_steps=a.warmup_steps,
                            num_clusters=a.num_clusters, layers=a.layers, hidden=a.hidden, seed=a.seed)
    print(run_demo(settings))


if __name__ == "__main__":
    main()
