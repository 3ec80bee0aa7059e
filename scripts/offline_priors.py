#!/usr/bin/env python
"""Write the offline priors file (history_spec 4) from verl's own validation-only generation over the training prompts.

    python scripts/offline_priors.py --config-name paper/qwen25_math_7b --samples 8 --out ~/data/priors.json \\
        data.train_files=... actor_rollout_ref.model.path=...          # GPU: the run's config, as you train it
    python scripts/offline_priors.py --cpu --samples 4 --out priors.json \\
        data.train_files=... actor_rollout_ref.model.path=... algorithm.bv_blend.codebook_path=...   # CPU (cpu_tiny)

verl's stock trainer runs the config with trainer.val_only=true over the training files (as data.val_files), N
samples a prompt at the run's temperature, and dumps the scored generations (trainer.validation_data_dir); every
sample is then keyed by the training row whose prompt verl rendered into exactly its input. The file,
{prompt key: [score, ...]}, is what algorithm.spo.offline_values and algorithm.bv_blend.prior_file read.
--dry-run prints the exact command and runs nothing; --from-dump converts an earlier run's dump again. docs/priors.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from bv_blend.history.priors import UnmatchedSamplesError, priors_from_dump
from bv_blend.verl.offline_priors import plan, render_training_prompts, run_generation
from instruments.cpu import cpu_env
from instruments.cpu.launch import run_trainer
from instruments.machine import describe_cpu

DEFAULT_SAMPLES = 8  # SPO's offline_N
CPU_CONFIG = "cpu_tiny"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-name", default=None,
                        help=f"the run's config, as for verl's main_ppo (default with --cpu: {CPU_CONFIG})")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                        help=f"samples per training prompt (default {DEFAULT_SAMPLES}, SPO's offline_N)")
    parser.add_argument("--out", type=Path, required=True, help="the prior file to write (JSON)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU through instruments.cpu.launch (docs/cpu.md)")
    parser.add_argument("--dry-run", action="store_true", help="check, print the exact command, run nothing")
    parser.add_argument("--dump-dir", type=Path, default=None,
                        help="trainer.validation_data_dir, with verl's log (default: <out>_generations/ beside --out)")
    parser.add_argument("--from-dump", type=Path, default=None,
                        help="convert this dump (<dump-dir>/0.jsonl of an earlier run) instead of generating")
    parser.add_argument("--timeout-s", type=float, default=None, help="CPU only: stop the run after this long")
    parser.add_argument("overrides", nargs="*", help="hydra overrides of the run (data.train_files=... and so on)")
    args = parser.parse_intermixed_args(argv)
    if args.config_name is None:
        if not args.cpu:
            parser.error("--config-name is required (the run's config, e.g. paper/qwen25_math_7b), or pass --cpu")
        args.config_name = CPU_CONFIG
    if args.samples < 1:
        parser.error(f"--samples {args.samples} must be >= 1")
    if stray := [o for o in args.overrides if "=" not in o]:
        parser.error(f"{stray} are not hydra overrides (key=value)")
    args.out = args.out.expanduser().resolve()
    if args.out.is_dir():
        parser.error(f"--out {args.out} is a folder; give the JSON file to write")
    if not _writable(args.out.parent):
        parser.error(f"--out {args.out}: cannot write in {args.out.parent}")
    if args.from_dump is not None and not args.from_dump.is_file():
        parser.error(f"--from-dump {args.from_dump} does not exist")
    if args.timeout_s is not None and not args.cpu:
        parser.error("--timeout-s applies to --cpu runs only")
    args.dump_dir = (args.dump_dir or args.out.with_name(f"{args.out.stem}_generations")).expanduser().resolve()
    return args


def _writable(folder: Path) -> bool:
    """Whether ``folder`` exists and is writable, or could be created under its first existing parent."""
    while not folder.exists():
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK)


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    try:
        job = plan(args.config_name, args.overrides, args.samples, args.dump_dir, args.cpu,
                   environment=cpu_env({}) if args.cpu else None)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.from_dump is None or args.dry_run:
        print(job.shell(), flush=True)
    if args.dry_run:
        print(f"dry run: the config composes and its inputs exist; the dump would go to {job.dump_path}")
        return 0
    try:
        prompts = render_training_prompts(
            job.config, progress=lambda rows, total: tqdm(rows, total=total, desc="rendering prompts", unit="row"))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    distinct = len({p.key for p in prompts})
    dump = args.from_dump
    generation_s = 0.0
    if dump is None:
        where = describe_cpu() if args.cpu else "GPU"
        print(f"[offline_priors] {len(prompts)} training rows ({distinct} distinct prompts) x {args.samples} samples: "
              f"verl's trainer, validation only ({where}); log: {args.dump_dir / 'verl.log'}", flush=True)
        t0 = time.monotonic()
        rc = run_generation(job, args.dump_dir / "verl.log", timeout_s=args.timeout_s,
                            cpu_launcher=run_trainer if args.cpu else None)
        generation_s = time.monotonic() - t0
        if rc != 0:
            print(f"error: verl's trainer exited {rc} after {generation_s:.0f} s; the end of "
                  f"{args.dump_dir / 'verl.log'} says why", file=sys.stderr)
            return rc
        dump = job.dump_path
    try:
        summary = priors_from_dump(dump, prompts, args.out)
    except (UnmatchedSamplesError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"[offline_priors] wrote {args.out}")
    for line in summary.lines():
        print(f"  {line}")
    timing = f"generation {generation_s:.0f} s, " if generation_s else ""
    print(f"[offline_priors] wall time: {timing}total {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
