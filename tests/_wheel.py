"""Build the package's wheel the way a release would, from a copy of the checkout's files (tracked and new, not
ignored: no .venv, no build leftovers), with setuptools' own backend and no network (~3 s)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def copy_checkout(work: Path) -> Path:
    """``work/source``: a copy of the checkout's files (tracked and new, not ignored; symlinks kept), as a clone has
    them, so that a build leaves nothing in the checkout."""
    source = work / "source"
    source.mkdir(parents=True)
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
        check=True,
    ).stdout.split()  # fmt: skip
    with tarfile.open(work / "files.tar", "w") as archive:
        for name in files:
            if (ROOT / name).exists() or (ROOT / name).is_symlink():  # a deleted but not yet committed file is gone
                archive.add(ROOT / name, arcname=name, recursive=False)
    with tarfile.open(work / "files.tar") as archive:
        archive.extractall(source, filter="tar")
    return source


def build_wheel(work: Path) -> Path:
    """The wheel built in ``work`` (which gets the source copy in ``work/source`` and the wheel in ``work/dist``)."""
    source, out = copy_checkout(work), work / "dist"
    out.mkdir()
    build = "from setuptools import build_meta; print(build_meta.build_wheel(__import__('sys').argv[1]))"
    subprocess.run([sys.executable, "-c", build, str(out)], cwd=source, capture_output=True, check=True)
    (wheel,) = out.glob("*.whl")
    return wheel
