"""A long comparison's state, between its run folder and the repository (scripts/run_state.py is its command line):
its shared preparation (``prepared/``) and each finished run's ``result.json`` with verl's per-step metrics (and a
resumed run's earlier attempts' ``metrics.part<i>.jsonl``), its group record (``groups.jsonl``) and the attempts a
fresh start replaced (``replaced.json``), what it needs to resume on another machine and what all its
reports read. Rollouts, logs, checkpoints and the model's converted folder stay out."""

from __future__ import annotations

import shutil
from pathlib import Path

from instruments.compare.runs import REPLACED_FILE, RESULT_FILE
from instruments.run.resume import metrics_files
from instruments.run.verl_run import GROUPS_FILE

PREPARED = "prepared"


def state_files(root: Path) -> list[Path]:
    """The state under ``root``, relative to it: every comparison's ``prepared/`` files, and its finished runs' results
    and metrics (an unfinished run's metrics stay: it resumes from its own folder)."""
    files = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(root)
        if path.name == RESULT_FILE and rel.parent.parent.name == "runs":
            kept = [*metrics_files(path.parent), path.parent / GROUPS_FILE, path.parent / REPLACED_FILE]
            files += [rel, *(m.relative_to(root) for m in kept if m.is_file())]
        elif PREPARED in rel.parts[:-1]:
            files.append(rel)
    return sorted(files)


def copy_state(source: Path, target: Path) -> list[Path]:
    """Copies the state of ``source`` into ``target`` (files there are replaced); returns what it copied."""
    if not source.is_dir():
        raise FileNotFoundError(f"{source} is not a folder: give the comparison's --out folder (or the state's)")
    files = state_files(source)
    for rel in files:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / rel, target / rel)
    return files
