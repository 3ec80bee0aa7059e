"""The user's guide (README.md, docs/*.md) says what the package is and what was found, not when or at which commit:
no commit hash, no date (those live in the run record, results/), and a README a reader can take in."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs._markdown import ROOT, guide_markdown

# A hex word of 7-40 characters with at least one digit and one letter a-f: a commit, short or full. English words
# ("defaced") have no digit, decimals ("14.499999999999998") no letter.
COMMIT = re.compile(r"(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w])")
ISO_DATE = re.compile(r"(?<!\d)(?:19|20)\d\d-[01]\d-[0-3]\d(?!\d)")
README_MAX_LINES = 150


def journal_marks(text: str) -> list[str]:
    return [match.group(0) for pattern in (COMMIT, ISO_DATE) for match in pattern.finditer(text)]


@pytest.mark.parametrize("path", guide_markdown(), ids=lambda path: path.relative_to(ROOT).as_posix())
def test_the_guide_names_no_commit_and_no_date(path: Path) -> None:
    marks = journal_marks(path.read_text())
    assert not marks, (
        f"{path.relative_to(ROOT)} names commits or dates: {marks}; the run record (results/journal.md, "
        "results/benchmarks.md, results/regime.md) keeps them, the guide points there"
    )


def test_the_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, more than {README_MAX_LINES}"


def test_commits_and_dates_are_caught_and_numbers_are_not() -> None:
    caught = "at `a22b8e4`, 17.8 min; at 3129ccd; full 9befa39c0ffee0123456789abcdef0123456789a; on 2026-12-05."
    assert journal_marks(caught) == [
        "a22b8e4",
        "3129ccd",
        "9befa39c0ffee0123456789abcdef0123456789a",
        "2026-12-05",
    ]
    passed = "0.145/0.01 is 14.499999999999998; 2.50384956; defaced; 1,389 tests; 1e-6; 0x7f; sha256 of it; 20 steps"
    assert journal_marks(passed) == []
