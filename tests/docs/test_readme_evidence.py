"""What the README and history.md tell a user quotes what was measured: every paired difference they give, a value
with its 95% interval, is one that ``scripts/regime_report.py`` printed into the generated
results/regime/recommendation.md from the committed summaries (test_regime_report.py holds that file to them), or
that ``scripts/fair_verdict_report.py`` printed into results/fair_verdict/report.md from the committed runs, and
each row of the README's headline table is its arm's difference and verdict in the summary
results/regime/pretrained_lm.json. A figure typed by hand, put on the wrong arm, or left behind when a summary
changed, fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = re.compile(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]")
RECOMMENDATION = "results/regime/recommendation.md"
FAIR_VERDICT_REPORT = "results/fair_verdict/report.md"
SUMMARY = "results/regime/pretrained_lm.json"

# The README headline table's arm labels (before the first " (" or the end of the cell) and their keys in the summary.
HEADLINE_ARMS = {
    "REINFORCE++ n = 1": "rpp1",
    "BV-Blend, cluster level, n = 2": "bv_cluster2",
    "BV-Blend n = 8": "bv_cluster8",
    "GRPO n = 8 + DAPO's dynamic sampling": "grpo8_dynamic",
    "HA-DW n = 8": "ha_dw8",
    "MaxNorm-AC with RLOO n = 8": "maxnorm_rloo8",
    "REINFORCE++ n = 1 + negative token filtering": "rpp1_ntf",
}


def flat(text: str) -> str:
    return " ".join(text.split())  # the docs wrap lines inside a figure


def between(path: str, start: str, end: str) -> str:
    text = (ROOT / path).read_text()
    first = text.index(start)
    return text[first : text.index(end, first + len(start))]


GUIDANCE = {
    "README": ("README.md", "", None),
    "history.md's seldom revisited": ("docs/history.md", "**Seldom revisited", "**Often revisited"),
}


def quoted_in(where: str) -> str:
    path, start, end = GUIDANCE[where]
    return (ROOT / path).read_text() if end is None else between(path, start, end)


def not_generated(guidance: str, recommendation: str) -> tuple[list[str], list[str]]:
    """The differences (value and interval) ``guidance`` quotes, and those of them ``recommendation`` does not hold."""
    quoted = INTERVAL.findall(flat(guidance))
    generated = set(INTERVAL.findall(flat(recommendation)))
    return quoted, [figure for figure in quoted if figure not in generated]


@pytest.mark.parametrize("where", sorted(GUIDANCE))
def test_every_difference_the_guidance_quotes_is_in_the_generated_recommendation(where: str) -> None:
    generated = (ROOT / RECOMMENDATION).read_text() + "\n" + (ROOT / FAIR_VERDICT_REPORT).read_text()
    quoted, typed = not_generated(quoted_in(where), generated)
    assert quoted, f"{where} quotes no measured difference: the pattern or the section moved"
    assert not typed, (
        f"{where} quotes differences that neither {RECOMMENDATION} nor {FAIR_VERDICT_REPORT} holds: {typed}; copy "
        "them from there (python scripts/regime_report.py and python scripts/fair_verdict_report.py write them)"
    )


def test_a_figure_that_is_not_generated_is_caught() -> None:
    recommendation = (ROOT / RECOMMENDATION).read_text()
    held = INTERVAL.findall(flat(recommendation))[0]  # a generated figure passes, wrapped across lines or not
    wrapped = held.replace(", ", ",\n  ")
    guidance = f"REINFORCE++ n = 1 is ahead by +0.999 [+0.998,\n  +0.999]; BV-Blend by {wrapped}."
    quoted, typed = not_generated(guidance, recommendation)
    assert quoted == ["+0.999 [+0.998, +0.999]", held] and typed == ["+0.999 [+0.998, +0.999]"]


def signed(value: float) -> str:
    return f"{value:+.3f}".replace("-0.000", "+0.000")


def as_quoted(difference: dict) -> str:
    return f"{signed(difference['value'])} [{signed(difference['low'])}, {signed(difference['high'])}]"


def headline_rows(readme: str) -> dict[str, tuple[str, str]]:
    """The README headline table: arm label -> (quoted difference, verdict)."""
    rows = {}
    for line in readme.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and INTERVAL.fullmatch(cells[1]):
            rows[cells[0].split(" (")[0]] = (cells[1], cells[2])
    return rows


def wrong_rows(readme: str, summary: dict) -> list[str]:
    rows = headline_rows(readme)
    wrong = [f"{label}: not in the README's table" for label in HEADLINE_ARMS if label not in rows]
    wrong += [f"{label}: an arm the test does not know" for label in rows if label not in HEADLINE_ARMS]
    for label, key in HEADLINE_ARMS.items():
        if label not in rows:
            continue
        arm = summary["arms"][key]
        expected = (as_quoted(arm["difference"]), arm["verdict"])
        if rows[label] != expected:
            wrong.append(f"{label}: README {rows[label]}, {SUMMARY} {expected}")
    return wrong


def test_the_readme_headline_table_is_the_generated_summary_arm_by_arm() -> None:
    summary = json.loads((ROOT / SUMMARY).read_text())
    assert not wrong_rows((ROOT / "README.md").read_text(), summary)


def test_a_figure_on_the_wrong_arm_is_caught() -> None:
    summary = json.loads((ROOT / SUMMARY).read_text())
    readme = (ROOT / "README.md").read_text()
    first, second = (as_quoted(summary["arms"][key]["difference"]) for key in ("rpp1", "bv_cluster2"))
    swapped = readme.replace(first, "SWAP").replace(second, first).replace("SWAP", second)
    assert swapped != readme
    assert len(wrong_rows(swapped, summary)) == 2
