#!/usr/bin/env python
"""Plot training dynamics of several runs from verl's logs (JSONL file logger or tensorboard).

    python scripts/plot_dynamics.py --run bv_blend=outputs/paper_qwen25_math_7b \\
        --run grpo=outputs/paper_grpo --out figures/dynamics [--smooth 10]

Each --run is NAME=PATH, PATH being a run folder written by scripts/train.py (metrics.jsonl or
tensorboard/), a JSONL file or a tensorboard folder. Writes reward.png, effective_signal_ratio.png,
response_length.png, entropy.png and weight_mean.png, and prints each metric's mean over the last steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bv_blend.paper.report import load_run, plot_dynamics, summarise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--out", type=Path, default=Path("figures/dynamics"))
    parser.add_argument("--smooth", type=int, default=1, help="rolling mean over this many steps")
    parser.add_argument("--last", type=int, default=50, help="steps averaged in the printed summary")
    args = parser.parse_args(argv)
    try:
        sources = _check(args)  # every argument, before any log is read
        runs = {name: load_run(path) for name, path in sources.items()}
        written, notes = plot_dynamics(runs, args.out, smooth=args.smooth)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}")
    print(summarise(runs, args.last).to_string(float_format=lambda v: f"{v:.4g}"))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _check(args: argparse.Namespace) -> dict[str, Path]:
    if args.smooth < 1 or args.last < 1:
        raise ValueError(f"--smooth ({args.smooth}) and --last ({args.last}) must be >= 1.")
    sources: dict[str, Path] = {}
    for item in args.run:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--run expects NAME=PATH, got {item!r}.")
        if name in sources:
            raise ValueError(f"--run name {name!r} is given twice; each run needs its own name.")
        sources[name] = Path(path)
    return sources


if __name__ == "__main__":
    sys.exit(main())
