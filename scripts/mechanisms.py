"""What each arm's mechanism did in a comparison: verl's loss, gradient norm, score and response length, and each
estimator's own counters, averaged over the finished runs' steps and seeds (instruments/compare/mechanisms.py).

    python scripts/mechanisms.py results/regime/pretrained_lm_runs/comparison/runs
    python scripts/mechanisms.py results/regime/pretrained_lm_runs/comparison/runs \\
        --docs results/benchmarks.md --section compare_pretrained_lm_mechanisms
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, help="a comparison's runs/ folder (or its state's in results/regime)")
    parser.add_argument("--docs", type=Path, default=None, help="write the tables between --section's markers here")
    parser.add_argument("--section", default="compare_pretrained_lm_mechanisms", help="the markers' name in --docs")
    args = parser.parse_args(argv)
    from instruments.compare import mechanisms
    from instruments.compare import report as compare_report

    try:
        tables = mechanisms.markdown(args.runs)
    except (FileNotFoundError, ValueError) as error:
        print(f"[mechanisms] {error}", file=sys.stderr)
        return 2
    if args.docs is None:
        print(tables)
        return 0
    begin, end = compare_report.markers(args.section)
    try:
        compare_report.write_benchmarks(args.docs, f"{begin}\n{tables}{end}", args.section)
    except ValueError as error:
        print(f"[mechanisms] {error}", file=sys.stderr)
        return 2
    print(f"[mechanisms] {args.runs} -> {args.docs} ({args.section})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
