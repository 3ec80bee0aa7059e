"""The paper's nine benchmarks: where each one's fields are, how it is scored, and loading local copies.

Benchmarks are read from local parquet, JSONL, JSON or CSV files as they are published (no hub access). Each
benchmark knows the column names of its usual releases and takes the first one a file has; ``--field``
settings (:meth:`Benchmark.with_fields`) name other columns.

Usual releases (the columns each benchmark tries, in order):

- MATH-500 (HuggingFaceH4/MATH-500, Qwen2.5-Math's ``math500/test.jsonl``): ``problem``, ``answer``, ``solution``,
  ``unique_id``.
- AIME 2024 (HuggingFaceH4/aime_2024 ``id, problem, solution, answer``; Maxwell-Jia/AIME_2024
  ``ID, Problem, Solution, Answer``; Qwen2.5-Math ``aime24/test.jsonl``).
- AIME 2025 (opencompass/AIME2025 ``question, answer``, two files I and II; math-ai/aime25 ``problem, answer``;
  yentinglin/aime_2025 ``id, problem, solution, answer``).
- AMC (AI-MO/aimo-validation-amc ``id, problem, answer`` with float answers, 83 problems of AMC 2022-23, the set
  LUFFY evaluates; math-ai/amc23 and Qwen2.5-Math ``amc23/test.jsonl`` ``id, question, answer``, 40 problems).
- Minerva-Math (Qwen2.5-Math ``minerva_math/test.jsonl``: ``problem, solution``, the answer is the solution's
  last ``\\boxed{}``; math-ai/minervamath ``question, answer``).
- OlympiadBench (Hothan/OlympiadBench ``OE_TO_maths_en_COMP`` and Qwen2.5-Math ``olympiadbench/test.jsonl``:
  ``id, question, solution`` (a list), ``final_answer`` (a list)).
- ARC-Challenge (allenai/ai2_arc: ``id, question, choices {text, label}, answerKey``).
- GPQA-Diamond (the official ``gpqa_diamond.csv``: ``Question, Correct Answer, Incorrect Answer 1..3, Record ID``).
- MMLU-Pro (TIGER-Lab/MMLU-Pro: ``question_id, question, options, answer`` (a letter)).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bv_blend.paper.eval.extract import extract_boxed

ROLES = ("question", "answer", "solution", "choices", "incorrect", "id")


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its place in the table, its scoring, and the columns of its usual releases.

    Attributes:
        name: registry key (``math500``); title: the table's column header (``MATH-500``).
        domain: ``in`` (in-domain maths) or ``ood`` (out of domain, multiple choice).
        kind: ``math`` (Math-Verify against a reference answer) or ``choice`` (option letter).
        samples: k, the samples per problem: avg@k for k > 1, pass@1 for k = 1.
        question_fields, answer_fields, solution_fields, choices_fields, id_fields: candidate columns for each
            role, the first present one is used. A maths benchmark without an answer column takes the last
            ``\\boxed{}`` of its solution (Minerva-Math as published). For ``choice``, the answer is the gold
            option as a letter, a label of the choices column or an index.
        incorrect_fields: GPQA-style columns holding the wrong options' texts (the answer column then holds
            the correct option's text).
    """

    name: str
    title: str
    domain: str
    kind: str
    samples: int
    question_fields: tuple[str, ...]
    answer_fields: tuple[str, ...] = ()
    solution_fields: tuple[str, ...] = ()
    choices_fields: tuple[str, ...] = ()
    incorrect_fields: tuple[str, ...] = ()
    id_fields: tuple[str, ...] = ()

    @property
    def metric(self) -> str:
        return f"avg@{self.samples}" if self.samples > 1 else "pass@1"

    def with_fields(self, **fields: Any) -> Benchmark:
        """A copy reading other columns: ``with_fields(question_field="prompt")`` (one column for that role),
        ``incorrect_fields=("w1", "w2")``; an empty ``id_field`` numbers the rows instead."""
        changes: dict[str, tuple[str, ...]] = {}
        for key, value in fields.items():
            role = key.removesuffix("_fields").removesuffix("_field")
            if role not in ROLES or not key.endswith(("_field", "_fields")):
                raise ValueError(f"{self.name}: unknown field setting {key!r}; use one of "
                                 f"{', '.join(r + '_field' for r in ROLES)}.")
            columns = (value,) if isinstance(value, str) else tuple(value)
            changes[f"{role}_fields"] = tuple(c for c in columns if c)
        return dataclasses.replace(self, **changes)

    def with_samples(self, samples: int) -> Benchmark:
        """A copy drawing ``samples`` per problem (avg@samples)."""
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"{self.name}: samples per problem must be a positive integer, got {samples!r}.")
        return dataclasses.replace(self, samples=samples)


_GPQA_WRONG = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")

# In the paper's column order: in-domain first, then out of domain. samples: avg@32 for the three small
# competition sets (AIME 2024: 30 problems, AIME 2025: 30, AMC: 83), pass@1 for the rest, as in LUFFY's
# evaluation set (data/valid.all.parquet holds each AIME/AMC problem 32 times and the others once).
BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("amc", "AMC", "in", "math", 32, ("problem", "question", "Problem", "Question"),
                  ("answer", "Answer"), ("solution", "Solution"), id_fields=("id", "ID")),
        Benchmark("math500", "MATH-500", "in", "math", 1, ("problem", "question"), ("answer",), ("solution",),
                  id_fields=("unique_id", "id")),
        Benchmark("minerva", "Minerva", "in", "math", 1, ("problem", "question"), ("answer",), ("solution",),
                  id_fields=("idx", "id")),
        Benchmark("aime24", "AIME 2024", "in", "math", 32, ("problem", "question", "Problem", "Question"),
                  ("answer", "Answer"), ("solution", "Solution"), id_fields=("id", "ID")),
        Benchmark("aime25", "AIME 2025", "in", "math", 32, ("problem", "question", "Problem", "Question"),
                  ("answer", "Answer"), ("solution", "Solution"), id_fields=("id", "ID", "problem_idx")),
        Benchmark("olympiadbench", "OlympiadBench", "in", "math", 1, ("question", "problem"),
                  ("final_answer", "answer"), ("solution",), id_fields=("id",)),
        Benchmark("arc_c", "ARC-C", "ood", "choice", 1, ("question",), ("answerKey",), choices_fields=("choices",),
                  id_fields=("id",)),
        Benchmark("gpqa_diamond", "GPQA-Diamond", "ood", "choice", 1, ("Question",), ("Correct Answer",),
                  incorrect_fields=_GPQA_WRONG, id_fields=("Record ID",)),
        Benchmark("mmlu_pro", "MMLU-Pro", "ood", "choice", 1, ("question",), ("answer",),
                  choices_fields=("options",), id_fields=("question_id",)),
    )
}


@dataclass(frozen=True)
class Problem:
    """One problem, normalised: reference answer text (math) or the gold option's index (choice).

    ``solution`` is the file's reference solution when it has one (``scripts/evaluate.py self-check``
    grades it against ``answer``).
    """

    id: str
    question: str
    answer: str | None = None
    options: tuple[str, ...] | None = None
    gold_index: int | None = None
    solution: str | None = None


def read_table(path: Path) -> pd.DataFrame:
    """A local parquet, JSONL, JSON or CSV file as a data frame (CSV cells stay strings)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Benchmark file {path} does not exist.")
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pd.read_parquet(path)
        if suffix in (".jsonl", ".json"):
            # dtype=False: no type guessing, so labels such as ARC's "1".."4" stay strings
            return pd.read_json(path, lines=suffix == ".jsonl", dtype=False)
        if suffix == ".csv":
            # keep_default_na=False: an answer "None" or "NA" is text, not a missing value
            return pd.read_csv(path, dtype=str, keep_default_na=False)
    except ValueError as exc:
        raise ValueError(f"{path} is not a readable {suffix[1:]} file: {exc}") from exc
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use .parquet, .jsonl, .json or .csv.")


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _answer_text(value: Any) -> str:
    """Reference answers come as strings, numbers (AMC's 142.0) or lists (OlympiadBench's ``["$2$"]``)."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    items = [str(v).strip() for v in _as_list(value) if v is not None]
    # OlympiadBench wraps each answer in $...$; the grader boxes a bare answer itself
    items = [i[1:-1].strip() if len(i) > 1 and i.startswith("$") and i.endswith("$") else i for i in items]
    return ", ".join(i for i in items if i)


def _solution_text(value: Any) -> str | None:
    items = [str(v) for v in _as_list(value) if v is not None and str(v).strip()]
    return "\n\n".join(items) if items else None


def _choice(bench: Benchmark, row: Mapping[str, Any], cols: Mapping[str, str], pid: str) -> tuple[tuple[str, ...], int]:
    if bench.incorrect_fields:
        texts = [row[cols["answer"]], *(row[c] for c in bench.incorrect_fields)]
        return tuple(str(t).strip() for t in texts), 0
    raw = row[cols["choices"]]
    labels: list[str] | None = None
    if isinstance(raw, Mapping):
        labels = [str(x) for x in _as_list(raw["label"])]
        raw = raw["text"]
    options = [str(x) for x in _as_list(raw)]
    gold = row[cols["answer"]]
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


def resolve_columns(bench: Benchmark, columns: Sequence[str], where: str) -> dict[str, str]:
    """Which column of a file plays each role; raises if a needed one is absent (naming the ``--field`` fix)."""
    present = set(columns)
    cols = {}
    for role in ROLES:
        found = next((c for c in getattr(bench, f"{role}_fields") if c in present), None)
        if found is not None:
            cols[role] = found
    if bench.kind == "math":
        # an answer column, or a solution whose last \boxed{} is the answer (Minerva-Math as published)
        needed = ["question"] + ([] if "solution" in cols else ["answer"])
    else:
        needed = ["question", "answer"] + ([] if bench.incorrect_fields else ["choices"])
    missing = [role for role in needed if role not in cols]
    missing += [f"incorrect ({c!r})" for c in bench.incorrect_fields if c not in present]
    if missing:
        tried = {role: list(getattr(bench, f"{role}_fields")) for role in needed if role not in cols}
        raise ValueError(
            f"{where} ({bench.name}) lacks the {', '.join(missing)} column(s) (tried {tried}); it has "
            f"{list(columns)}. Map a column with --field {bench.name}.<role>_field=<column>, role one of "
            f"{', '.join(ROLES)}."
        )
    return cols


def _cell(value: Any) -> str | None:
    """A cell as text; None for a missing value (None, NaN, empty)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    text = str(value)
    return text if text.strip() else None


def load_problems(bench: Benchmark, path: Path | Sequence[Path], limit: int | None = None) -> list[Problem]:
    """Read a benchmark's file(s) into :class:`Problem` s.

    Several files (AIME 2025 ships as parts I and II) are read in order; their problem ids get the file's
    stem as a prefix so that they stay unique.
    """
    paths = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]
    problems: list[Problem] = []
    for path_ in paths:
        frame = read_table(path_)
        cols = resolve_columns(bench, list(frame.columns), str(path_))
        prefix = f"{path_.stem}/" if len(paths) > 1 else ""
        for row_number, row in enumerate(frame.to_dict("records")):
            raw_id = _cell(row[cols["id"]]) if "id" in cols else None
            pid = prefix + (raw_id if raw_id is not None else str(row_number))
            question = str(row[cols["question"]]).strip()
            solution = _solution_text(row[cols["solution"]]) if "solution" in cols else None
            if bench.kind == "choice":
                options, gold = _choice(bench, row, cols, pid)
                problems.append(Problem(pid, question, options=options, gold_index=gold, solution=solution))
                continue
            answer = _answer_text(row[cols["answer"]]) if "answer" in cols else ""
            if not answer and solution:  # Minerva-Math as published: the answer is in the solution
                answer = extract_boxed(solution) or ""
            if not answer:
                raise ValueError(
                    f"{path_} ({bench.name}) problem {pid}: no reference answer"
                    + (" and no \\boxed{} in its solution." if solution else ".")
                )
            problems.append(Problem(pid, question, answer=answer, solution=solution))
    if not problems:
        raise ValueError(f"{', '.join(map(str, paths))} ({bench.name}) has no rows.")
    duplicates = sorted(pid for pid, n in Counter(p.id for p in problems).items() if n > 1)
    if duplicates:
        raise ValueError(
            f"{bench.name}: problem ids {duplicates[:5]} occur more than once; pass --field {bench.name}.id_field= "
            "(empty) to number the rows instead, or name a unique column."
        )
    return problems[:limit]


def parse_benchmark_args(
    benches: Sequence[str], fields: Sequence[str] = (), samples: Sequence[str] = ()
) -> dict[str, tuple[Benchmark, list[Path]]]:
    """Command-line ``NAME=PATH[,PATH...]``, ``NAME.<role>_field=COLUMN`` and ``NAME=K`` (samples) settings.

    Raises:
        ValueError: an unknown benchmark name, a malformed pair, or a setting for a benchmark not given.
    """
    chosen: dict[str, tuple[Benchmark, list[Path]]] = {}
    for item in benches:
        name, sep, paths = item.partition("=")
        if not sep or not paths:
            raise ValueError(f"--bench expects NAME=PATH, got {item!r}.")
        if name not in BENCHMARKS:
            raise ValueError(f"Unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}.")
        if name in chosen:
            raise ValueError(f"--bench {name} given twice; list several files as {name}=PATH1,PATH2.")
        chosen[name] = (BENCHMARKS[name], [Path(p).expanduser() for p in paths.split(",") if p])
    for item in fields:
        target, sep, column = item.partition("=")
        name, dot, attr = target.partition(".")
        if not sep or not dot:
            raise ValueError(f"--field expects NAME.<role>_field=COLUMN, got {item!r}.")
        if name not in chosen:
            raise ValueError(f"--field {item!r}: benchmark {name!r} is not among the --bench ones.")
        value: Any = tuple(c for c in column.split(",") if c) if attr.endswith("_fields") else column
        bench, path = chosen[name]
        chosen[name] = (bench.with_fields(**{attr: value}), path)
    for item in samples:
        name, sep, k = item.partition("=")
        if not sep or name not in chosen:
            raise ValueError(f"--samples expects NAME=K for a --bench benchmark, got {item!r}.")
        try:
            count = int(k)
        except ValueError:
            raise ValueError(f"--samples {item!r}: K must be an integer.") from None
        bench, path = chosen[name]
        chosen[name] = (bench.with_samples(count), path)
    # keep the paper's order whatever the command line's
    return {name: chosen[name] for name in BENCHMARKS if name in chosen}
