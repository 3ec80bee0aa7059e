"""The paper's nine benchmarks: where each one's fields are, how it is scored, and loading local copies.

Benchmarks are read from local parquet or JSONL files (no hub access). Column names default to those of
the usual Hugging Face releases and can be changed per benchmark (``with_fields``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its place in the table, its scoring, and its columns.

    Attributes:
        name: registry key (``math500``); title: the table's column header (``MATH-500``).
        domain: ``in`` (in-domain maths) or ``ood`` (out of domain, multiple choice).
        kind: ``math`` (Math-Verify against a reference answer) or ``choice`` (option letter).
        samples: samples per problem: 32 for avg@32, 1 for pass@1.
        question_field, answer_field: the columns holding the problem and its reference answer. For
            ``choice``: the gold option as a letter, a label of ``choices_field`` or an index, or (GPQA)
            the correct option's text when ``incorrect_fields`` is set.
        choices_field: ``choice`` options: a list column, or a ``{"text": [...], "label": [...]}`` column.
        incorrect_fields: GPQA-style columns holding the wrong options' texts.
        id_field: a stable problem id (else the row number); it also seeds the option permutation.
    """

    name: str
    title: str
    domain: str
    kind: str
    samples: int
    question_field: str
    answer_field: str
    choices_field: str | None = None
    incorrect_fields: tuple[str, ...] = ()
    id_field: str | None = None

    @property
    def metric(self) -> str:
        return f"avg@{self.samples}" if self.samples > 1 else "pass@1"

    def with_fields(self, **fields: Any) -> Benchmark:
        """A copy with other column names, e.g. ``with_fields(question_field="prompt")``."""
        unknown = set(fields) - {f.name for f in dataclasses.fields(self) if f.name.endswith(("_field", "_fields"))}
        if unknown:
            raise ValueError(f"{self.name}: unknown field setting(s) {sorted(unknown)}; use *_field names.")
        return dataclasses.replace(self, **fields)


_GPQA_WRONG = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")

# In the paper's column order: in-domain first, then out of domain.
BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("amc", "AMC", "in", "math", 32, "problem", "answer", id_field="id"),
        Benchmark("math500", "MATH-500", "in", "math", 32, "problem", "answer", id_field="unique_id"),
        Benchmark("minerva", "Minerva", "in", "math", 1, "question", "answer"),
        Benchmark("aime24", "AIME 2024", "in", "math", 1, "problem", "answer", id_field="id"),
        Benchmark("aime25", "AIME 2025", "in", "math", 1, "problem", "answer"),
        Benchmark("olympiadbench", "OlympiadBench", "in", "math", 1, "question", "final_answer", id_field="id"),
        Benchmark("arc_c", "ARC-C", "ood", "choice", 1, "question", "answerKey", "choices", id_field="id"),
        Benchmark("gpqa_diamond", "GPQA-Diamond", "ood", "choice", 1, "Question", "Correct Answer",
                  incorrect_fields=_GPQA_WRONG, id_field="Record ID"),
        Benchmark("mmlu_pro", "MMLU-Pro", "ood", "choice", 1, "question", "answer", "options", id_field="question_id"),
    )
}


@dataclass(frozen=True)
class Problem:
    """One problem, normalised: reference answer text (math) or the gold option's index (choice)."""

    id: str
    question: str
    answer: str | None = None
    options: tuple[str, ...] | None = None
    gold_index: int | None = None


def read_table(path: Path) -> pd.DataFrame:
    """A local parquet, JSONL or JSON file as a data frame."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Benchmark file {path} does not exist.")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if suffix in (".jsonl", ".json"):
        # dtype=False: no type guessing, so labels such as ARC's "1".."4" stay strings
        return pd.read_json(path, lines=suffix == ".jsonl", dtype=False)
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use .parquet, .jsonl or .json.")


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _answer_text(value: Any) -> str:
    """Reference answers come as strings, numbers (AMC's 142.0) or one-element lists (OlympiadBench)."""
    items = [v for v in _as_list(value) if v is not None]
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return ", ".join(str(v).strip() for v in items)


def _choice(bench: Benchmark, row: Mapping[str, Any], pid: str) -> tuple[tuple[str, ...], int]:
    if bench.incorrect_fields:
        options = [str(row[bench.answer_field]).strip(), *(str(row[f]).strip() for f in bench.incorrect_fields)]
        return tuple(options), 0
    raw = row[bench.choices_field]
    labels: list[str] | None = None
    if isinstance(raw, Mapping):
        labels = [str(x) for x in _as_list(raw["label"])]
        raw = raw["text"]
    options = [str(x) for x in _as_list(raw)]
    gold = row[bench.answer_field]
    if labels is not None and str(gold) in labels:  # a label first: ARC labels some options "1".."4"
        index = labels.index(str(gold))
    elif isinstance(gold, (int, np.integer)) and not isinstance(gold, bool):
        index = int(gold)
    elif isinstance(gold, str) and len(gold.strip()) == 1 and gold.strip().upper().isalpha():
        index = ord(gold.strip().upper()) - ord("A")
    else:
        raise ValueError(f"{bench.name} problem {pid}: cannot read the gold option from {gold!r}.")
    if not 0 <= index < len(options):
        raise ValueError(f"{bench.name} problem {pid}: gold option {gold!r} is not among {len(options)} options.")
    return tuple(options), index


def load_problems(bench: Benchmark, path: Path, limit: int | None = None) -> list[Problem]:
    """Read a benchmark file into :class:`Problem` s, checking the configured columns exist."""
    frame = read_table(path)
    needed = [bench.question_field, bench.answer_field, *bench.incorrect_fields]
    if bench.choices_field and not bench.incorrect_fields:
        needed.append(bench.choices_field)
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{path} ({bench.name}) lacks column(s) {missing}; it has {list(frame.columns)}. "
            f"Map them with --field {bench.name}.<question_field|answer_field|...>=<column>."
        )
    problems = []
    for row_number, row in enumerate(frame.to_dict("records")[:limit]):
        has_id = bench.id_field and bench.id_field in row and row[bench.id_field] is not None
        pid = str(row[bench.id_field]) if has_id else str(row_number)
        question = str(row[bench.question_field]).strip()
        if bench.kind == "choice":
            options, gold = _choice(bench, row, pid)
            problems.append(Problem(pid, question, options=options, gold_index=gold))
        else:
            problems.append(Problem(pid, question, answer=_answer_text(row[bench.answer_field])))
    if not problems:
        raise ValueError(f"{path} ({bench.name}) has no rows.")
    return problems


def parse_benchmark_args(benches: list[str], fields: list[str] = ()) -> dict[str, tuple[Benchmark, Path]]:
    """Command-line ``NAME=PATH`` pairs and ``NAME.<x>_field=COLUMN`` settings to configured benchmarks.

    Raises:
        ValueError: an unknown benchmark name, a malformed pair, or a field setting for a benchmark not given.
    """
    chosen: dict[str, tuple[Benchmark, Path]] = {}
    for item in benches:
        name, sep, path = item.partition("=")
        if not sep or not path:
            raise ValueError(f"--bench expects NAME=PATH, got {item!r}.")
        if name not in BENCHMARKS:
            raise ValueError(f"Unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}.")
        chosen[name] = (BENCHMARKS[name], Path(path).expanduser())
    for item in fields:
        target, sep, column = item.partition("=")
        name, dot, attr = target.partition(".")
        if not sep or not dot:
            raise ValueError(f"--field expects NAME.<x>_field=COLUMN, got {item!r}.")
        if name not in chosen:
            raise ValueError(f"--field {item!r}: benchmark {name!r} is not among the --bench ones.")
        value: Any = tuple(c for c in column.split(",") if c) if attr.endswith("_fields") else column
        bench, path = chosen[name]
        chosen[name] = (bench.with_fields(**{attr: value}), path)
    # keep the paper's order whatever the command line's
    return {name: chosen[name] for name in BENCHMARKS if name in chosen}
