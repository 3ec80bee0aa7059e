"""README's first command works for a new user (issue 37, point 5): the install line of its "Install" section, run as
written in a copy of the checkout (what a clone holds), resolves to this package with its extra, offline.

pip runs for real (``--dry-run``: it builds the metadata with setuptools, resolves, and installs nothing;
``--no-index --no-deps --no-build-isolation``: no network, nothing but the local files; ``--ignore-installed``: the
test's own environment, which has the package, does not count). A line naming the package
alone, ``pip install "bv-blend[codebook]"`` (the package is not on PyPI), fails here as it fails for a user.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests._wheel import copy_checkout

ROOT = Path(__file__).resolve().parents[1]


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def install_line() -> list[str]:
    """The first ``pip install`` of the Install section's first code block, its comment dropped, as the shell
    splits it."""
    block = re.search(r"```bash\n(.*?)```", readme_section("Install"), re.S)
    assert block, "README's Install section has no bash block"
    line = next(line for line in block.group(1).splitlines() if line.strip().startswith("pip install"))
    return shlex.split(line, comments=True)


def test_the_readme_install_line_installs_this_package_offline(tmp_path):
    argv = install_line()
    assert argv[:2] == ["pip", "install"]
    clone = copy_checkout(tmp_path)
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", *argv[1:], "--dry-run", "--no-deps", "--no-build-isolation", "--no-index",
         "--ignore-installed", "--disable-pip-version-check", "--quiet", "--report", str(report)],
        cwd=clone, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, f"`{shlex.join(argv)}` fails in a clone:\n{result.stderr[-2000:]}"
    installs = json.loads(report.read_text())["install"]
    assert len(installs) == 1, installs
    (item,) = installs
    assert item["metadata"]["name"] == "bv-blend"
    assert item["requested_extras"] == ["codebook"]
    assert item["download_info"]["url"] == clone.resolve().as_uri()  # this checkout's files, nothing downloaded

