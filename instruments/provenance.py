"""Which code and which committed files a measurement ran from: what a result records, and what a settings file a
comparison reads must be (results/regime.md: a rule or a setting is committed before the runs that read it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


DIRTY = "+dirty"  # code_commit's mark of a checkout whose tracked files differ from its commit


def code_commit() -> str:
    """The checkout's commit, marked ``+dirty`` where tracked files differ from it ("unknown" outside git)."""
    try:
        head = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (DIRTY if dirty else "")


def commit_at_start() -> dict:
    """What a run or a launch records of its code as it starts: the commit, and whether the tree matched it."""
    commit = code_commit()
    return {"commit": commit.removesuffix(DIRTY), "tree_clean": not commit.endswith(DIRTY)}


def committed_file(path: Path) -> str:
    """The last commit that changed ``path``, which must be tracked by git and unchanged since; raises with the fix
    otherwise (a setting read from a file nobody committed, or edited after its commit, has no date to name)."""
    path = Path(path).resolve()
    try:
        tracked = _git("ls-files", "--", path.name, cwd=path.parent)
    except (OSError, subprocess.CalledProcessError) as e:
        raise ValueError(f"{path} is not in a git checkout ({e}): commit it before the runs that read it") from e
    # ls-files lists a file added but never committed too: the log says whether a commit holds it
    has_commits = _git_ok("rev-parse", "--verify", "-q", "HEAD", cwd=path.parent)
    commit = _git("log", "-1", "--format=%h", "--", path.name, cwd=path.parent) if tracked and has_commits else ""
    if not commit:
        raise ValueError(f"{path} is not committed: commit it before the runs that read it (results/regime.md)")
    changed = _git("status", "--porcelain", "--", path.name, cwd=path.parent)
    if changed:
        raise ValueError(f"{path} differs from its commit {commit}: commit the change before the runs that read it, "
                         "or check the file out again")
    return commit


def _git_ok(*args: str, cwd: Path) -> bool:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True).returncode == 0
