"""The token-level lab: the demo's tiny Qwen2 trained with RL, one arm per estimator, through verl's estimators.

    python scripts/lab_token.py --suite quick --out /tmp/lab_token            # a few minutes on 2 cores
    python scripts/lab_token.py --suite full --out runs/lab_token --jobs 2    # within 2 hours; results/token_lab/lab_token.md
    python scripts/lab_token.py --suite full --out runs/lab_token --lr-sweep  # + lr x0.5 and x2 (ref and best)
    python scripts/lab_token.py --suite full --out runs/lab_token --report-only
    python scripts/lab_token.py --suite select --out runs/lab_token_select    # the lr/step selection (done once)
    python scripts/lab_token.py --suite regime --out runs/regime_token --jobs 2 --lr-sweep regime
                                  # no prompt drawn twice (issue 29): ~50 min; results/token_lab/token_lab.md and .json

A stopped suite resumes: rerun the same command (finished runs are kept; a folder made with other settings is
refused). The logic lives in instruments/lab/token; results/token_lab/lab_token.md explains the lab and holds the full suite's
report.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("quick", "full", "select", "regime"), default="quick")
    parser.add_argument("--out", type=Path, required=True, help="folder for the result files (resumable)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--report-only", action="store_true", help="rewrite the report from DIR; run nothing")
    parser.add_argument("--report", type=Path, default=None,
                        help="report path (default: results/token_lab/lab_token.md for full, DIR/lab_token.md otherwise)")
    parser.add_argument("--lr-sweep", nargs="?", const="best", default=None, metavar="ARM",
                        help="after the comparison, also run the reference and ARM (default: the arm that comes out "
                             "best; the regime suite: 'regime', REINFORCE++ n=1 and the package's best arm by "
                             "instruments/rule.py) at x0.5 and x2 the learning rate")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if args.lr_sweep is not None and args.suite == "select":
        parser.error("--lr-sweep is for the comparison suites (quick, full), not for select")
    from instruments.lab.token.arms import ARMS

    if args.suite == "regime" and args.lr_sweep not in (None, "regime"):
        parser.error(f"--lr-sweep {args.lr_sweep}: the regime suite's check is 'regime' (results/regime.md)")
    if args.suite != "regime" and args.lr_sweep not in (None, "best") and args.lr_sweep not in ARMS:
        parser.error(f"--lr-sweep {args.lr_sweep}: not an arm key ({', '.join(ARMS)}), or 'best'")
    if args.report_only:
        if not (args.out / "manifest.json").is_file():
            parser.error(f"--report-only needs {args.out}/manifest.json from an earlier run of this suite")
    else:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            probe = args.out / ".lab_token_write_check"
            probe.write_text("")
            probe.unlink()
        except OSError as error:
            parser.error(f"--out {args.out} is not a writable folder: {error}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the workers, before they import torch
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import numpy as np
    import torch

    torch.set_num_threads(1)
    import verl

    from instruments.lab.token import report, runner, suites
    from instruments.lab.token.store import SettingsMismatch, Store, write_json
    from instruments.machine import describe_machine

    try:
        suite = suites.SUITES[args.suite]()
    except FileNotFoundError as error:
        print(f"[lab_token] {error}", file=sys.stderr)
        return 2
    store = Store(args.out)
    found = store.read_manifest()
    if found is not None and found != store.manifest(suite.name, suite.settings):
        print(f"[lab_token] {args.out} was made by another suite or other settings ({found.get('suite')}); "
              "use another --out", file=sys.stderr)
        return 2
    path = args.report or (Path(suite.report) if suite.report else args.out / "lab_token.md")
    if args.report_only:
        results = runner.collect(suite, args.out, args.lr_sweep)
        info = report.load_info(args.out)
    else:
        print(f"[lab_token] suite {suite.name}: {len(suite.arms)} arms x {len(suite.seeds)} seeds x "
              f"{len(suite.lrs)} lr, {suite.settings.steps} steps, {args.jobs} process(es); results in {args.out}")
        start = time.perf_counter()
        try:
            results = runner.run_suite(suite, args.out, args.jobs, args.lr_sweep)
        except SettingsMismatch as error:
            print(f"[lab_token] {error}", file=sys.stderr)
            return 2
        info = report.RunInfo(
            command="python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]),
            wall_seconds=time.perf_counter() - start, jobs=args.jobs, machine=describe_machine(),
            versions=f"verl {verl.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
                     f"Python {platform.python_version()}", date=time.strftime("%Y-%m-%d %H:%M"))
        report.save_info(info, args.out)
    frozen = None
    if suite.name == "select":
        from instruments.lab.token.freeze import frozen_settings

        frozen = frozen_settings(results)
        write_json(args.out / "frozen.json", frozen)
        print(f"[lab_token] frozen settings: lr {frozen['lr']:g}, {frozen['steps']} steps -> {args.out}/frozen.json "
              f"(copy it to {suites.FROZEN} for the full suite)")
    if suite.name == "regime":
        from instruments.lab.token import regime

        written = regime.write(results, info, args.out, path)
        print(f"[lab_token] wrote {written} and its summary for the rule")
        return 0
    written = report.write_report(results, info, path, frozen)
    print(f"[lab_token] wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
