"""The paper's training set: OpenR1-Math-220k (default split) -> 45,000 verl rows.

The paper's lineage (LUFFY, arXiv 2504.14945; its 46k subset ``Openr1-Math-46k-8192``) keeps a problem when
SOME generation of DeepSeek-R1 in the data set is correct by Math-Verify (``correctness_math_verify``), has
complete reasoning (``is_reasoning_complete``) and is at most 8,192 tokens long. The check is per generation:
a problem with a correct short generation beside a wrong long one stays.

Each row gets one fate, the first stage it fails (or ``kept``); every stage prints how many rows it removed:

1. ``no_correct_generation``: Math-Verify verified none of the row's generations;
2. ``no_complete_correct_generation``: every correct generation has incomplete reasoning;
3. ``unparsable_answer``: Math-Verify cannot parse the reference answer into a maths object (checked here with
   :func:`bv_blend.paper.rewards.answer_parses`; the trainer's reward could never pay out on such a row);
4. ``no_short_correct_generation``: every complete correct generation is longer than ``max_generation_tokens``
   under the policy's tokenizer.

Then a seeded sample of ``sample_size`` rows gets the prompt template and verl's columns.

``length_rule`` keeps the earlier row-level rules for comparison: ``any`` drops a row if any generation (right
or wrong) is over the limit, ``all`` only if every one is; both skip stage 2, as that pipeline did.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from tqdm.auto import tqdm

from bv_blend.codebook.parquet import read_parquet
from bv_blend.paper.rewards import answer_parses, get_pool

DATA_SOURCE = "open-r1/OpenR1-Math-220k"
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
DEFAULT_TEMPLATE = "{question} " + INSTRUCTION
KEPT = "kept"
STAGES = ("no_correct_generation", "no_complete_correct_generation", "unparsable_answer", "no_short_correct_generation")
LENGTH_RULES = ("correct", "any", "all")  # "correct": the lineage's; "any"/"all": the earlier row-level rules

# The default split's 14 columns and types, as its dataset card (README.md, dataset_info) publishes them.
OPENR1_SCHEMA = pa.schema(
    [
        ("problem", pa.string()),
        ("solution", pa.string()),
        ("answer", pa.string()),
        ("problem_type", pa.string()),
        ("question_type", pa.string()),
        ("source", pa.string()),
        ("uuid", pa.string()),
        ("is_reasoning_complete", pa.list_(pa.bool_())),
        ("generations", pa.list_(pa.string())),
        ("correctness_math_verify", pa.list_(pa.bool_())),
        ("correctness_llama", pa.list_(pa.bool_())),
        ("finish_reasons", pa.list_(pa.string())),
        ("correctness_count", pa.int64()),
        ("messages", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
    ]
)
_NEEDED = ["problem", "answer", "uuid", "generations", "correctness_math_verify", "is_reasoning_complete"]


def load_openr1(paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """Concatenate local OpenR1-Math-220k parquet shards, checking the columns this pipeline reads."""
    if not paths:
        raise ValueError("no OpenR1-Math-220k parquet files given (download data/train-*.parquet of the default split)")
    frames = []
    for path in paths:
        table = read_parquet(path, _NEEDED, what="OpenR1-Math-220k", hint="is it the default split?", columns=_NEEDED)
        frames.append(table.to_pandas())
    df = pd.concat(frames, ignore_index=True)
    if df.empty:
        raise ValueError("the OpenR1-Math-220k files hold no rows")
    return df


def _flags(value: Any, n: int, column: str, uuid: str) -> list[bool]:
    """A row's per-generation flags; null means unknown, which never counts as True."""
    if value is None:
        return [False] * n
    flags = [bool(v) for v in value]
    if len(flags) != n:
        raise ValueError(
            f"row uuid={uuid}: {n} generations but {len(flags)} values in {column}; the columns of one row must "
            "line up (is this OpenR1-Math-220k's default split?)"
        )
    return flags


def generation_flags(df: pd.DataFrame) -> tuple[list[list[bool]], list[list[bool]]]:
    """Per row, per generation: (correct by Math-Verify, reasoning complete)."""
    correct, complete = [], []
    for gens, verified, finished, uuid in zip(
        df["generations"], df["correctness_math_verify"], df["is_reasoning_complete"], df["uuid"], strict=True
    ):
        n = 0 if gens is None else len(gens)
        correct.append(_flags(verified, n, "correctness_math_verify", uuid))
        complete.append(_flags(finished, n, "is_reasoning_complete", uuid))
    return correct, complete


def _answers_parse(answers: list[str], timeout_s: float) -> list[bool]:
    """Math-Verify parse checks, run in parallel in the reward worker pool."""
    with ThreadPoolExecutor(max_workers=get_pool().max_workers) as pool:
        jobs = pool.map(lambda answer: answer_parses(answer, timeout_s=timeout_s), answers)
        return list(tqdm(jobs, total=len(answers), desc="math-verify answers", unit="row"))


def _load_tokenizer(tokenizer_path: str | os.PathLike) -> Any:
    from transformers import AutoTokenizer

    if not Path(tokenizer_path).exists():
        raise FileNotFoundError(f"tokenizer path {tokenizer_path} does not exist; give the policy's local model dir")
    return AutoTokenizer.from_pretrained(str(tokenizer_path))


def token_counts(texts: Sequence[str], tokenizer: Any, batch: int = 256, desc: str = "tokenizing") -> list[int]:
    """Number of tokens of each text (no special tokens), in batches."""
    counts: list[int] = []
    for start in tqdm(range(0, len(texts), batch), desc=desc, unit="batch", disable=len(texts) <= batch):
        ids = tokenizer(list(texts[start : start + batch]), add_special_tokens=False)["input_ids"]
        counts += [len(x) for x in ids]
    return counts


def generation_token_lengths(df: pd.DataFrame, tokenizer_path: str | os.PathLike, batch: int = 256) -> list[list[int]]:
    """Token count of every generation of every row, under the tokenizer at ``tokenizer_path``."""
    tokenizer = _load_tokenizer(tokenizer_path)
    flat = [(i, str(g)) for i, gens in enumerate(df["generations"]) for g in (gens if gens is not None else [])]
    counts = token_counts([g for _, g in flat], tokenizer, batch, desc="tokenizing generations")
    lengths: list[list[int]] = [[] for _ in range(len(df))]
    for (row, _), n in zip(flat, counts, strict=True):
        lengths[row].append(n)
    return lengths


def has_short_candidate(
    generations: Sequence[Sequence[str]], candidates: Sequence[Sequence[int]], tokenizer: Any, max_tokens: int
) -> list[bool]:
    """Per row: is one of its candidate generations at most ``max_tokens`` tokens long?

    Candidates are tried shortest text first, one round per rank, so most rows cost one tokenization.
    """
    order = [sorted(c, key=lambda g, gens=gens: len(gens[g])) for gens, c in zip(generations, candidates, strict=True)]
    found = [False] * len(order)
    for rank in range(max((len(o) for o in order), default=0)):
        rows = [r for r, o in enumerate(order) if not found[r] and rank < len(o)]
        texts = [str(generations[r][order[r][rank]]) for r in rows]
        counts = token_counts(texts, tokenizer, desc=f"tokenizing correct generations (round {rank + 1})")
        for r, n in zip(rows, counts, strict=True):
            found[r] = n <= max_tokens
    return found


def row_fates(
    df: pd.DataFrame,
    tokenizer_path: str | os.PathLike,
    *,
    max_generation_tokens: int = 8192,
    length_rule: str = "correct",
    timeout_s: float = 5.0,
) -> pd.Series:
    """Each row's fate: the first stage of :data:`STAGES` it fails, or ``"kept"``. Prints each stage's count."""
    if length_rule not in LENGTH_RULES:
        raise ValueError(f"length_rule must be one of {', '.join(LENGTH_RULES)}, got {length_rule!r}")
    if max_generation_tokens < 1:
        raise ValueError(f"max_generation_tokens must be >= 1, got {max_generation_tokens}")
    tokenizer = _load_tokenizer(tokenizer_path)  # fail on a bad path before the slow steps
    fates = np.full(len(df), KEPT, dtype=object)
    correct, complete = generation_flags(df)
    gens = [[] if g is None else list(g) for g in df["generations"]]

    def stage(name: str, fails: Sequence[bool], alive: np.ndarray) -> None:
        before = int((fates == KEPT).sum())
        fates[alive[np.asarray(fails, dtype=bool)]] = name
        left = int((fates == KEPT).sum())
        print(f"filter {name}: removed {before - left} of {before} rows, {left} left")

    alive = np.flatnonzero(fates == KEPT)
    stage(STAGES[0], [not any(correct[r]) for r in alive], alive)
    candidates = [[g for g, ok in enumerate(correct[r]) if ok and complete[r][g]] for r in range(len(df))]
    alive = np.flatnonzero(fates == KEPT)
    if length_rule == "correct":
        stage(STAGES[1], [not candidates[r] for r in alive], alive)
    else:  # the row-level rules never looked at completeness
        stage(STAGES[1], [False] * len(alive), alive)
    alive = np.flatnonzero(fates == KEPT)
    answers = [str(a) if a is not None else "" for a in df["answer"].to_numpy()[alive]]
    stage(STAGES[2], [not ok for ok in _answers_parse(answers, timeout_s)], alive)
    alive = np.flatnonzero(fates == KEPT)
    if length_rule == "correct":
        short = has_short_candidate([gens[r] for r in alive], [candidates[r] for r in alive], tokenizer,
                                    max_generation_tokens)
        stage(STAGES[3], [not s for s in short], alive)
    else:
        flat = [(i, str(g)) for i, r in enumerate(alive) for g in gens[r]]
        counts = token_counts([g for _, g in flat], tokenizer, desc="tokenizing generations")
        over: list[list[bool]] = [[] for _ in alive]
        for (i, _), n in zip(flat, counts, strict=True):
            over[i].append(n > max_generation_tokens)
        reduce = any if length_rule == "any" else all
        stage(STAGES[3], [bool(o) and reduce(o) for o in over], alive)
    return pd.Series(fates, index=df.index, name="fate")


def to_verl_rows(df: pd.DataFrame, template: str = DEFAULT_TEMPLATE, split: str = "train") -> pd.DataFrame:
    """verl's columns (as in its examples/data_preprocess scripts), one row per problem, index 0..n-1."""
    if "{question}" not in template:
        raise ValueError("the prompt template must contain '{question}'")
    rows = []
    for index, (problem, raw_answer, uuid) in enumerate(zip(df["problem"], df["answer"], df["uuid"], strict=True)):
        answer = str(raw_answer)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": template.replace("{question}", problem)}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index, "question": problem, "answer": answer, "uuid": uuid},
            }
        )
    return pd.DataFrame(rows)


def prepare_openr1(
    inputs: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    tokenizer_path: str | os.PathLike,
    *,
    sample_size: int | None = 45_000,
    seed: int = 0,
    max_generation_tokens: int = 8192,
    length_rule: str = "correct",
    template: str = DEFAULT_TEMPLATE,
    timeout_s: float = 5.0,
) -> dict:
    """Run the whole pipeline, write ``output`` (parquet) and ``<output>.stats.json``; return the stats.

    ``sample_size=None`` keeps every row that survives (shuffled with ``seed``).

    Raises:
        ValueError: bad arguments, bad input files, or fewer surviving rows than ``sample_size`` (the message
            gives each stage's count and the fix). Nothing is written then.
    """
    output = Path(output)
    if output.resolve() in {Path(p).resolve() for p in inputs}:
        raise ValueError(f"output {output} is one of the inputs; choose another path")
    if "{question}" not in template:
        raise ValueError("the prompt template must contain '{question}'")
    if sample_size is not None and sample_size < 1:
        raise ValueError(f"sample_size must be >= 1 (or None for all rows), got {sample_size}")
    df = load_openr1(inputs)
    fates = row_fates(
        df, tokenizer_path, max_generation_tokens=max_generation_tokens, length_rule=length_rule, timeout_s=timeout_s
    )
    counts = fates.value_counts()
    stats: dict = {
        "input_rows": len(df),
        "length_rule": length_rule,
        "max_generation_tokens": max_generation_tokens,
        "removed": {name: int(counts.get(name, 0)) for name in STAGES},
        "after_filters": int(counts.get(KEPT, 0)),
    }
    kept = df[(fates == KEPT).to_numpy()]
    if sample_size is not None and sample_size > len(kept):
        removed = ", ".join(f"{name} {n}" for name, n in stats["removed"].items())
        raise ValueError(
            f"only {len(kept)} of {len(df)} rows survive the filters (removed: {removed}), fewer than "
            f"--sample-size {sample_size}. Pass --sample-size {len(kept)} (or 'all') to use them all, or check that "
            "every shard of the default split (data/train-*.parquet) was given."
        )
    kept = kept.sample(n=sample_size or len(kept), random_state=seed).reset_index(drop=True)
    out = to_verl_rows(kept, template)
    stats.update(sample_size=len(out), seed=seed, output=str(output))
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    out.to_parquet(tmp, index=False)
    os.replace(tmp, output)
    output.with_name(output.name + ".stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats
