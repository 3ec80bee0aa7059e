"""The estimator lab: simulated RLVR runs of every estimator on the same random numbers; writes DIR/lab.md and plots.

    python scripts/lab.py --suite quick --out /tmp/lab      # a few minutes on 2 cores
    python scripts/lab.py --suite full --out results/lab       # up to about 30 minutes
    python scripts/lab.py --suite regime --out results/lab --jobs 1   # no prompt drawn twice (results/lab/regime.md)

See results/lab.md for the environment, the metrics and the full suite's results.
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

RESULTS = "results.pkl"  # the suite, its results and run info, to rerender the report without rerunning


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("quick", "full", "regime"), default="quick")
    parser.add_argument("--out", type=Path, required=True, help="directory for lab.md and the PNG plots")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--seeds", type=int, default=None, help="override the suite's number of seeds (>= 2)")
    parser.add_argument("--steps", type=int, default=None, help="override the suite's steps per run")
    parser.add_argument("--summary-dir", type=Path, default=None,
                        help="--suite regime: where logistic_lab.json goes (default results/regime)")
    parser.add_argument(
        "--rerender", action="store_true", help="rewrite DIR/lab.md and plots from DIR/results.pkl (no runs)"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if args.seeds is not None and args.seeds < 2:
        parser.error("--seeds must be >= 2 (confidence intervals need two seeds)")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be >= 1")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        probe = args.out / ".lab_write_check"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        parser.error(f"--out {args.out} is not a writable directory: {error}")
    if args.rerender and args.suite != "regime" and not (args.out / RESULTS).is_file():
        parser.error(f"--rerender needs {args.out / RESULTS} from an earlier run of this script")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import numpy as np
    import torch

    torch.set_num_threads(1)  # before any torch work: the runs are tiny, and forked workers must not share a pool
    import verl

    from instruments.lab.experiments import run_experiments
    from instruments.lab.report import RunInfo, write_report
    from instruments.lab.suites import SUITES
    from instruments.machine import describe_machine

    if args.suite == "regime":
        return regime_main(args, argv)
    if args.rerender:
        with open(args.out / RESULTS, "rb") as handle:
            saved = pickle.load(handle)
        path = write_report(saved["suite"], saved["results"], saved["info"], args.out)
        print(f"[lab] rewrote {path} from {args.out / RESULTS}")
        return 0
    suite = SUITES[args.suite]()
    if args.steps is not None:
        experiments = tuple(
            replace(e, arms=tuple(replace(a, spec=replace(a.spec, steps=args.steps)) for a in e.arms))
            for e in suite.experiments
        )
        suite = replace(suite, steps=args.steps, experiments=experiments)
    if args.seeds is not None:
        suite = replace(suite, seeds=args.seeds)
    print(f"[lab] suite {suite.name}: {suite.seeds} seeds x {suite.steps} steps, {args.jobs} process(es)")
    start = time.perf_counter()
    # every finished run is kept in <out>/runs: the same command after an interruption continues where it stopped
    cache = args.out / "runs"
    earlier = set(cache.glob("*.pkl")) if cache.exists() else set()
    results = run_experiments(suite.experiments, suite.seeds, suite.pilot_steps, jobs=args.jobs, cache=cache)
    wall = time.perf_counter() - start
    used = set(cache.glob("*.pkl"))
    info = RunInfo(
        command="python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]),
        wall_seconds=wall,
        jobs=args.jobs,
        runs=len(used),
        runs_from_earlier=len(used & earlier),
        machine=describe_machine(),
        versions=f"verl {verl.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
        f"Python {platform.python_version()}",
    )
    with open(args.out / RESULTS, "wb") as handle:
        pickle.dump({"suite": suite, "results": results, "info": info}, handle)
    path = write_report(suite, results, info, args.out)
    print(f"[lab] wrote {path} and its plots in {wall / 60:.1f} min")
    return 0


def regime_main(args: argparse.Namespace, argv: list[str] | None) -> int:
    """The no-revisit regime (issue 29): its own runs (cached in DIR/regime/runs), the summary the rule reads, and
    DIR/regime.md. ``--rerender`` reads every run from that cache (running any that is missing)."""
    import subprocess

    from instruments import regime
    from instruments.lab.regime import SEEDS, RegimeSpec
    from instruments.lab.regime_report import write_report
    from instruments.lab.regime_suite import build_summary, run_suite
    from instruments.machine import describe_machine

    base = RegimeSpec("grpo8") if args.steps is None else RegimeSpec("grpo8", steps=args.steps)
    seeds = SEEDS if args.seeds is None else args.seeds
    print(f"[lab] suite regime: {seeds} seeds x {base.steps} steps, {args.jobs} process(es)")
    start = time.perf_counter()
    suite = run_suite(base, seeds, cache=args.out / "regime" / "runs", jobs=args.jobs)
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])])
    summary = build_summary(suite, command, describe_machine())
    written = regime.write_summary(summary, args.summary_dir or regime.SUMMARY_DIR)
    rule_commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", "results/regime.md"], capture_output=True,
                                 text=True, check=False).stdout.strip() or "unknown"  # fmt: skip
    path = write_report(summary, suite, args.out, (time.perf_counter() - start) / 60, rule_commit)
    print(f"[lab] wrote {written} and {path} in {(time.perf_counter() - start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
