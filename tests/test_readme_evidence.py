"""What the README and history.md tell a user to run quotes what was measured (the brief's "guidance that holds"):
every paired difference their what-to-run text gives, a value with its 95% interval, is one that
``scripts/regime_report.py`` printed into the generated results/regime/recommendation.md, from the committed summaries
(test_regime_report.py holds that file to them). A figure typed by hand, or left behind when a summary changed,
fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INTERVAL = re.compile(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]")


def flat(text: str) -> str:
    return " ".join(text.split())  # the docs wrap lines inside a figure


def between(path: str, start: str, end: str) -> str:
    text = (ROOT / path).read_text()
    first = text.index(start)
    return text[first : text.index(end, first + len(start))]


GUIDANCE = {
    "README's What to run": ("README.md", "\n## What to run\n", "\n## "),
    "history.md's seldom revisited": ("docs/history.md", "**Seldom revisited", "**Often revisited"),
}


def not_generated(guidance: str, recommendation: str) -> tuple[list[str], list[str]]:
    """The differences (value and interval) ``guidance`` quotes, and those of them ``recommendation`` does not hold."""
    quoted = INTERVAL.findall(flat(guidance))
    generated = set(INTERVAL.findall(flat(recommendation)))
    return quoted, [figure for figure in quoted if figure not in generated]


@pytest.mark.parametrize("where", sorted(GUIDANCE))
def test_every_difference_the_guidance_quotes_is_in_the_generated_recommendation(where: str) -> None:
    recommendation = (ROOT / "results/regime/recommendation.md").read_text()
    quoted, typed = not_generated(between(*GUIDANCE[where]), recommendation)
    assert quoted, f"{where} quotes no measured difference: the pattern or the section moved"
    assert not typed, (
        f"{where} quotes differences that results/regime/recommendation.md does not hold: {typed}; copy them from it "
        "(python scripts/regime_report.py writes it)"
    )


def test_a_figure_that_is_not_generated_is_caught() -> None:
    recommendation = (ROOT / "results/regime/recommendation.md").read_text()
    held = INTERVAL.findall(flat(recommendation))[0]  # a generated figure passes, wrapped across lines or not
    wrapped = held.replace(", ", ",\n  ")
    guidance = f"REINFORCE++ n = 1 is ahead by +0.999 [+0.998,\n  +0.999]; BV-Blend by {wrapped}."
    quoted, typed = not_generated(guidance, recommendation)
    assert quoted == ["+0.999 [+0.998, +0.999]", held] and typed == ["+0.999 [+0.998, +0.999]"]
