"""The fair verdict's report (results/fair_verdict.md, issue 56), from whatever run state exists so far: the tuning,
every arm at GRPO's learning rate and at its own, the readings beside the rule's, the cold start; pending where runs
have not finished. Writes results/fair_verdict/report.md, its plots (the tuning's among them) and runs.md, where every
run came from (instruments/fair_verdict_report.py).

    python scripts/fair_verdict_report.py                       # into results/fair_verdict/
    python scripts/fair_verdict_report.py --out /tmp/verdict    # somewhere else
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from instruments import fair_verdict

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=fair_verdict.REPORT,
                        help="folder of the report and its plots (default results/fair_verdict)")
    args = parser.parse_args(argv)
    from instruments.fair_verdict_report import write_report

    print(f"[fair verdict] wrote {write_report(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
