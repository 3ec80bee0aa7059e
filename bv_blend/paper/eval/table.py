"""The results table in the paper's layout: one row per run; in-domain benchmarks, their mean, OOD, their mean."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from bv_blend.paper.eval.benchmarks import BENCHMARKS

ID_MEAN, OOD_MEAN = "ID avg", "OOD avg"


def results_table(runs: Mapping[str, Mapping[str, float]]) -> pd.DataFrame:
    """Scores (fractions in [0, 1], keyed by benchmark name) to a table of percentages.

    A benchmark a run lacks is NaN, and so is the mean of its group: a mean over fewer benchmarks
    would not be the paper's number.
    """
    unknown = {name for scores in runs.values() for name in scores} - set(BENCHMARKS)
    if unknown:
        raise ValueError(f"Unknown benchmark(s) {sorted(unknown)}; known: {list(BENCHMARKS)}.")
    columns: list[str] = []
    rows = {}
    for run, scores in runs.items():
        row: dict[str, float] = {}
        for domain, mean_name in (("in", ID_MEAN), ("ood", OOD_MEAN)):
            values = []
            for bench in (b for b in BENCHMARKS.values() if b.domain == domain):
                value = 100.0 * scores[bench.name] if bench.name in scores else math.nan
                row[bench.title] = value
                values.append(value)
            row[mean_name] = sum(values) / len(values)  # NaN if any is NaN
        rows[run] = row
        columns = list(row)
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns).rename_axis("run")


def to_markdown(table: pd.DataFrame, digits: int = 1) -> str:
    """A GitHub markdown table (pandas' own needs the ``tabulate`` package, not worth a dependency here)."""

    def cell(value: float) -> str:
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"

    header = [table.index.name or "", *table.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * len(table.columns)) + "|"]
    for run, row in table.iterrows():
        lines.append("| " + " | ".join([str(run), *(cell(v) for v in row)]) + " |")
    return "\n".join(lines) + "\n"


def write_table(table: pd.DataFrame, out_prefix: Path, digits: int = 1) -> tuple[Path, Path]:
    """Write ``<prefix>.md`` and ``<prefix>.csv``; returns both paths."""
    out_prefix = Path(out_prefix)
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    md, csv = out_prefix.with_suffix(".md"), out_prefix.with_suffix(".csv")
    md.write_text(to_markdown(table, digits))
    table.round(digits).to_csv(csv)
    return md, csv
