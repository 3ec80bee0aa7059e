"""bv-blend priors: write the offline priors file (history_spec 4) from verl's own validation-only generation.

    bv-blend priors --config-name paper/qwen25_math_7b --samples 8 --out ~/data/priors.json \\
        data.train_files=... actor_rollout_ref.model.path=...          # the run's config, as you train it

verl's stock trainer runs the config with trainer.val_only=true over the training files (as data.val_files), N
samples a prompt at the run's temperature, and dumps the scored generations (trainer.validation_data_dir); every
sample is then keyed by the training row whose prompt verl rendered into exactly its input. The file,
{prompt key: [score, ...]}, is what algorithm.spo.offline_values and algorithm.bv_blend.prior_file read.
--dry-run prints the exact command and runs nothing; --from-dump converts an earlier run's dump again. docs/priors.md.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bv_blend.cli.errors import CommandError

SUMMARY = "write the offline priors (each training prompt's scores under the initial policy) with verl's generation"
DEFAULT_SAMPLES = 8  # SPO's offline_N


@dataclass(frozen=True)
class Platform:
    """Where verl's generation runs. The installed command starts verl's ``main_ppo`` on the machine it is on (GPU);
    the repository's ``scripts/offline_priors.py --cpu`` passes its CPU harness in here, which the package never
    imports (an instrument, outside the wheel).

    Attributes:
        description: what the progress line says the run is on.
        launcher: runs the job's trainer (``run_trainer`` of the CPU harness); ``None``: ``main_ppo`` as a subprocess.
        environment: the variables the run adds to the environment.
        timeout_s: stop the run after this long (the launcher's option).
    """

    description: str = "GPU"
    launcher: Callable[..., int] | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of the command, shared with ``scripts/offline_priors.py`` (which adds its CPU options)."""
    parser.add_argument("--config-name", default=None, help="the run's config, as for verl's main_ppo (required)")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                        help=f"samples per training prompt (default {DEFAULT_SAMPLES}, SPO's offline_N)")
    parser.add_argument("--out", type=Path, required=True, help="the prior file to write (JSON)")
    parser.add_argument("--dry-run", action="store_true", help="check, print the exact command, run nothing")
    parser.add_argument("--dump-dir", type=Path, default=None,
                        help="trainer.validation_data_dir, with verl's log (default: <out>_generations/ beside --out)")
    parser.add_argument("--from-dump", type=Path, default=None,
                        help="convert this dump (<dump-dir>/0.jsonl of an earlier run) instead of generating")
    parser.add_argument("overrides", nargs="*", help="hydra overrides of the run (data.train_files=... and so on)")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What can be checked before anything is composed (``parser.error`` exits 2); fills in the dump folder."""
    if args.config_name is None:
        parser.error("--config-name is required: the run's config, as you train it (e.g. paper/qwen25_math_7b)")
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
    args.dump_dir = (args.dump_dir or args.out.with_name(f"{args.out.stem}_generations")).expanduser().resolve()


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    # intermixed: hydra overrides may come before, between or after the options, as with verl's main_ppo
    args = parser.parse_intermixed_args(argv)
    check_arguments(parser, args)
    return args


def _writable(folder: Path) -> bool:
    """Whether ``folder`` exists and is writable, or could be created under its first existing parent."""
    while not folder.exists():
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK)


def run(args: argparse.Namespace, platform: Platform | None = None) -> int:
    # verl, hydra and the tokenizer load only here: `bv-blend --help` stays fast
    from tqdm.auto import tqdm

    from bv_blend.history.priors import UnmatchedSamplesError, priors_from_dump
    from bv_blend.verl.offline_priors import plan, render_training_prompts, run_generation

    platform = platform or Platform()
    started = time.monotonic()
    try:
        job = plan(args.config_name, args.overrides, args.samples, args.dump_dir, platform.launcher is not None,
                   environment=platform.environment)
    except ValueError as error:
        raise CommandError(str(error)) from error
    if args.from_dump is None or args.dry_run:
        print(job.shell(), flush=True)
    if args.dry_run:
        print(f"dry run: the config composes and its inputs exist; the dump would go to {job.dump_path}")
        return 0
    try:
        prompts = render_training_prompts(
            job.config, progress=lambda rows, total: tqdm(rows, total=total, desc="rendering prompts", unit="row"))
    except ValueError as error:
        raise CommandError(str(error)) from error
    distinct = len({p.key for p in prompts})
    dump = args.from_dump
    generation_s = 0.0
    if dump is None:
        log = args.dump_dir / "verl.log"
        print(f"[offline_priors] {len(prompts)} training rows ({distinct} distinct prompts) x {args.samples} samples: "
              f"verl's trainer, validation only ({platform.description}); log: {log}", flush=True)
        t0 = time.monotonic()
        rc = run_generation(job, log, timeout_s=platform.timeout_s, cpu_launcher=platform.launcher)
        generation_s = time.monotonic() - t0
        if rc != 0:
            raise CommandError(f"verl's trainer exited {rc} after {generation_s:.0f} s; the end of {log} says why",
                               code=rc)
        dump = job.dump_path
    try:
        summary = priors_from_dump(dump, prompts, args.out)
    except (UnmatchedSamplesError, ValueError) as error:
        raise CommandError(str(error), code=1) from error
    print(f"[offline_priors] wrote {args.out}")
    for line in summary.lines():
        print(f"  {line}")
    timing = f"generation {generation_s:.0f} s, " if generation_s else ""
    print(f"[offline_priors] wall time: {timing}total {time.monotonic() - started:.0f} s")
    return 0
