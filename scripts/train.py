#!/usr/bin/env python
"""Train one of the paper's configs with verl's trainer (python -m verl.trainer.main_ppo).

    python scripts/train.py --config qwen25_math_7b \\
        --train-files data/openr1_45k/annotated/train.parquet --val-files data/val/math500.parquet \\
        --model ~/models/Qwen2.5-Math-7B --codebook data/openr1_45k/codebook.npz \\
        [--gpus-per-node 8] [--nnodes 1] [--output-dir outputs/paper_NAME] [--dry-run] [-- hydra overrides ...]

--dry-run checks every path, composes the config with all overrides, runs verl's own config checks, prints
the exact command and exits. Multi-node: start Ray first (`ray start --head --port=6379` on node 0,
`ray start --address=<node0-ip>:6379` on the others), then run this once on node 0 with --nnodes N
--ray-address <node0-ip>:6379. Anything after `--` is passed to hydra, e.g.
`trainer.total_training_steps=10` or `algorithm.adv_estimator=grpo trainer.experiment_name=grpo_1p5b`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from bv_blend.paper import build_train_launch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a config in configs/paper/: qwen25_math_7b (main), grpo, ...")
    parser.add_argument("--train-files", nargs="+", type=Path, required=True, help="verl-format training parquet(s)")
    parser.add_argument("--val-files", nargs="+", type=Path, required=True, help="verl-format validation parquet(s)")
    parser.add_argument("--model", type=Path, required=True, help="local Hugging Face model folder")
    parser.add_argument("--codebook", type=Path, default=None, help="codebook from `bv-blend codebook`")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--ray-address", default=None, help="head-ip:port of a running Ray cluster (multi-node)")
    parser.add_argument("--output-dir", type=Path, default=None, help="default outputs/paper_CONFIG")
    parser.add_argument("--dry-run", action="store_true", help="check and print the command, do not run it")
    parser.add_argument("overrides", nargs="*", help="hydra overrides after --, passed to verl last (they win)")
    args = parser.parse_args(argv)
    stray = [str(p) for p in [*args.train_files, *args.val_files] if "=" in str(p)]
    if stray:
        parser.error(f"{stray} look like hydra overrides: put them after `--` (the file options take several paths).")
    return args


def verl_config_check(config) -> None:
    """verl's own validation of the composed config (batch divisibility, micro-batches, dataclasses)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        launch = build_train_launch(
            args.config,
            train_files=args.train_files,
            val_files=args.val_files,
            model=args.model,
            codebook=args.codebook,
            gpus_per_node=args.gpus_per_node,
            nnodes=args.nnodes,
            output_dir=args.output_dir,
            ray_address=args.ray_address,
            overrides=args.overrides,
        )
        verl_config_check(launch.config)
    except (ValueError, FileNotFoundError, AssertionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(launch.shell(), flush=True)
    if args.dry_run:
        print(f"dry run: paths exist, the config composes and passes verl's checks; outputs: {launch.output_dir}")
        return 0
    launch.output_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(launch.argv, env={**os.environ, **launch.env}, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
