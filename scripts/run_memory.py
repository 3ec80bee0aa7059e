"""What each verl run on this CPU machine takes in memory, while it runs: the peak of its processes' summed PSS
(instruments/cpu/memory.py), per run, beside the machine's least available memory.

Start it beside the runs (the demo, a comparison, the test suite) and stop it with Ctrl-C or SIGTERM (``kill``: a
watch started in the background of a script, where SIGINT is ignored), or give it --seconds. It rewrites --out (JSON)
after every sample, so a watch that is cut off keeps what it saw; it prints the table at the end.

    python scripts/run_memory.py --out /tmp/peaks.json & watch=$!; bash scripts/test.sh; kill $watch
    python scripts/run_memory.py --seconds 600 --interval 2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path

from tqdm.auto import tqdm

from instruments.cpu.memory import MemoryWatch
from instruments.machine import describe_cpu


def write(watch: MemoryWatch, out: Path) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"cpu": describe_cpu(), "least_available_gib": watch.least_available_gib,
                               "runs": {run: asdict(peak) for run, peak in watch.runs.items()}}, indent=1))
    os.replace(tmp, out)


def table(watch: MemoryWatch) -> str:
    lines = [f"{'run':44s} {'peak GiB':>8s} {'least available GiB':>19s}  seen (UTC)"]
    for run, peak in watch.runs.items():
        lines.append(f"{run[:44]:44s} {peak.peak_gib:8.2f} {peak.least_available_gib:19.2f}  "
                     f"{peak.first_seen}-{peak.last_seen}")
    lines.append(f"the machine's least available memory while watching: {watch.least_available_gib:.2f} GiB")
    return "\n".join(lines)


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the watch as Ctrl-C does: with its table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples (default 5)")
    p.add_argument("--seconds", type=float, default=None, help="stop after this long (default: at Ctrl-C)")
    p.add_argument("--out", type=Path, default=Path("run_memory.json"), help="JSON, rewritten after every sample")
    a = p.parse_args(argv)
    if a.interval <= 0:
        p.error(f"--interval must be above 0 seconds, got {a.interval}")
    if not a.out.resolve().parent.is_dir():
        p.error(f"--out {a.out}: its folder does not exist; create it or give a path in an existing folder")
    watch, deadline = MemoryWatch(), None if a.seconds is None else time.monotonic() + a.seconds
    signal.signal(signal.SIGTERM, _stop)
    print(describe_cpu(), flush=True)
    try:
        with tqdm(desc="samples", unit="sample") as bar:
            while deadline is None or time.monotonic() < deadline:
                watch.sample()
                write(watch, a.out)
                bar.set_postfix(runs=len(watch.runs), least_available=f"{watch.least_available_gib:.1f} GiB")
                bar.update()
                time.sleep(a.interval if deadline is None else max(0.0, min(a.interval,
                                                                            deadline - time.monotonic())))
    except KeyboardInterrupt:
        pass
    print(table(watch), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
