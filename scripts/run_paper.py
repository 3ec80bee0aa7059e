#!/usr/bin/env python
"""The paper end to end on one 8-GPU node: prepare OpenR1 data -> build the codebook -> train.

    python scripts/run_paper.py --openr1 ~/data/OpenR1-Math-220k/data/train-*.parquet \\
        --model ~/models/Qwen2.5-Math-7B --val-files data/val/math500.parquet --work-dir work/paper \\
        [--config grpo] [--num-clusters 64] [--dry-run] [-- hydra overrides for training]

Writes work/paper/data/train.parquet, work/paper/codebook_k64/{codebook.npz,train.parquet,report.md} and
work/paper/runs/<config>/ (checkpoints, metrics.jsonl, tensorboard/). Steps whose outputs exist are skipped;
--force reruns them. --dry-run checks the inputs and prints the three commands.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bv_blend.paper.pipeline import DEFAULT_NUM_CLUSTERS, paper_steps, run_steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--openr1", nargs="+", type=Path, required=True, help="OpenR1-Math-220k parquet shards")
    parser.add_argument("--model", type=Path, required=True, help="local Hugging Face model folder")
    parser.add_argument("--val-files", nargs="+", type=Path, required=True, help="verl-format validation parquet(s)")
    parser.add_argument("--work-dir", type=Path, default=Path("work/paper"))
    parser.add_argument("--config", default="qwen25_math_7b", help="a config in configs/paper/ (e.g. grpo)")
    parser.add_argument("--num-clusters", type=int, default=DEFAULT_NUM_CLUSTERS)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--ray-address", default=None)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--force", action="store_true", help="rerun steps whose outputs exist")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for training, after --")
    args = parser.parse_args(argv)
    try:
        steps = paper_steps(
            openr1=args.openr1, model=args.model, val_files=args.val_files, work_dir=args.work_dir,
            config=args.config, num_clusters=args.num_clusters, gpus_per_node=args.gpus_per_node,
            nnodes=args.nnodes, ray_address=args.ray_address, overrides=args.overrides,
            scripts_dir=Path(__file__).resolve().parent,
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run_steps(steps, dry_run=args.dry_run, force=args.force)


if __name__ == "__main__":
    sys.exit(main())
