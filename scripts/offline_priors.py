#!/usr/bin/env python
"""`bv-blend priors`, with the repository's CPU harness: the offline priors from verl's generation on CPU.

    python scripts/offline_priors.py --cpu --samples 4 --out priors.json \\
        data.train_files=... actor_rollout_ref.model.path=... algorithm.bv_blend.codebook_path=...   # CPU (cpu_tiny)

Every option but --cpu and --timeout-s is the installed command's (`bv-blend priors --help`, docs/priors.md). The
CPU platform is an instrument of this repository, not of the package, so only this face can pass it in.
"""

from __future__ import annotations

import argparse
import sys

from bv_blend.cli import priors
from bv_blend.cli.errors import run_guarded

CPU_CONFIG = "cpu_tiny"


def build_parser() -> argparse.ArgumentParser:
    """The installed command's parser (one definition, in the package) plus the CPU options."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    priors.add_arguments(parser)
    cpu = parser.add_argument_group("CPU (this repository's harness, docs/cpu.md)")
    cpu.add_argument("--cpu", action="store_true",
                     help=f"run on CPU through instruments.cpu.launch (default --config-name {CPU_CONFIG})")
    cpu.add_argument("--timeout-s", type=float, default=None, help="stop the CPU run after this long")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)
    if args.cpu and args.config_name is None:
        args.config_name = CPU_CONFIG
    if args.timeout_s is not None and not args.cpu:
        parser.error("--timeout-s applies to --cpu runs only")
    priors.check_arguments(parser, args)
    return args


def platform(args: argparse.Namespace) -> priors.Platform:
    """The installed command's default (verl's main_ppo on this machine's GPUs), or the CPU harness."""
    if not args.cpu:
        return priors.Platform()
    from instruments.cpu import cpu_env
    from instruments.cpu.launch import run_trainer
    from instruments.machine import describe_cpu

    return priors.Platform(describe_cpu(), run_trainer, cpu_env({}), args.timeout_s)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_guarded("offline_priors", lambda: priors.run(args, platform(args)))


if __name__ == "__main__":
    sys.exit(main())
