"""A long comparison's state, between its run folder and the repository: so that it resumes on another machine.

A comparison of verl's CPU harness spans sessions and machines; what it needs to resume, and all its reports read,
is small: its shared preparation (``prepared/``: task, codebook and, for the tiny model, the warmed-up weights) and
each finished run's ``result.json``, with verl's per-step metrics (``metrics.jsonl``, and a resumed run's earlier
attempts' ``metrics.part<i>.jsonl``: what the write-ups read beyond the result, such as a companion's own
counters). ``save`` copies those from the run folder into the repository (rollouts, logs and checkpoints stay out);
``restore`` copies them back, to where they were made (the preparation's record holds absolute paths), after which
the comparison's own command skips the finished runs. SmolLM2's converted folder stays out too: the comparison
converts it again where this machine lacks it.

    python scripts/run_state.py save /work/runs/pretrained_sweep results/regime/pretrained_lm_runs/sweep
    python scripts/run_state.py restore /work/runs/pretrained_sweep results/regime/pretrained_lm_runs/sweep

A folder holding several comparisons (the settings sweep: one per learning rate) is saved whole.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from instruments.compare.runs import RESULT_FILE
from instruments.compare.state import copy_state


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("save", "restore"))
    p.add_argument("runs", type=Path, help="the comparison's --out folder")
    p.add_argument("state", type=Path, help="the state's folder in the repository")
    a = p.parse_args(argv)
    source, target = (a.runs, a.state) if a.action == "save" else (a.state, a.runs)
    try:
        files = copy_state(source, target)
    except FileNotFoundError as e:
        print(f"[state] {e}", file=sys.stderr)
        return 2
    results = sum(rel.name == RESULT_FILE for rel in files)
    print(f"[state] {a.action}: {len(files)} files ({results} finished runs) from {source} to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
