"""The paper's training set: OpenR1-Math-220k (default split) -> 45,000 verl rows.

Steps, in order, each reporting how many rows it removed:

1. ``no_verified_generation``: drop rows where Math-Verify verified none of the dataset's own
   generations against the reference answer (column ``correctness_math_verify``);
2. ``unparsable_answer``: drop rows whose reference answer Math-Verify cannot parse into a maths
   object (run here, through :func:`bv_blend.rewards.answer_parses`, with a timeout per answer;
   math-verify's string fallback does not count as a parse);
3. ``long_generation``: drop rows with a generation longer than ``max_generation_tokens`` tokens
   under the policy's tokenizer (``rule="any"``; ``"all"`` drops a row only if every generation is);
4. a seeded sample of ``sample_size`` rows, then the prompt template and verl's columns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from tqdm.auto import tqdm

from bv_blend.codebook.parquet import read_parquet
from bv_blend.paper.rewards import answer_parses, get_pool

DATA_SOURCE = "open-r1/OpenR1-Math-220k"
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
DEFAULT_TEMPLATE = "{question} " + INSTRUCTION

# The default split's columns and types, as published on the Hugging Face hub.
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
_NEEDED = ["problem", "answer", "uuid", "generations", "correctness_math_verify"]


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


def filter_no_verified_generation(df: pd.DataFrame) -> pd.DataFrame:
    keep = df["correctness_math_verify"].map(lambda flags: flags is not None and bool(np.any(flags)))
    return df[keep.to_numpy(dtype=bool)]


def filter_unparsable_answers(df: pd.DataFrame, timeout_s: float = 5.0) -> pd.DataFrame:
    """Keep rows whose answer Math-Verify parses (checks run in parallel in the reward worker pool)."""
    answers = df["answer"].fillna("").astype(str).tolist()

    def ok(answer: str) -> bool:
        return answer_parses(answer, timeout_s=timeout_s)

    with ThreadPoolExecutor(max_workers=get_pool().max_workers) as pool:
        keep = list(tqdm(pool.map(ok, answers), total=len(answers), desc="math-verify answers", unit="row"))
    return df[np.asarray(keep, dtype=bool)]


def generation_token_lengths(df: pd.DataFrame, tokenizer_path: str | os.PathLike, batch: int = 256) -> list[list[int]]:
    """Token count of every generation of every row, under the tokenizer at ``tokenizer_path``."""
    from transformers import AutoTokenizer

    if not Path(tokenizer_path).exists():
        raise FileNotFoundError(f"tokenizer path {tokenizer_path} does not exist; give the policy's local model dir")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path))
    flat = [(i, str(g)) for i, gens in enumerate(df["generations"]) for g in (gens if gens is not None else [])]
    counts = np.zeros(len(flat), dtype=np.int64)
    for start in tqdm(range(0, len(flat), batch), desc="tokenizing generations", unit="batch"):
        texts = [g for _, g in flat[start : start + batch]]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        counts[start : start + len(texts)] = [len(x) for x in ids]
    lengths: list[list[int]] = [[] for _ in range(len(df))]
    for (row, _), n in zip(flat, counts, strict=True):
        lengths[row].append(int(n))
    return lengths


def filter_long_generations(
    df: pd.DataFrame, tokenizer_path: str | os.PathLike, max_tokens: int = 8192, rule: str = "any"
) -> pd.DataFrame:
    """Drop rows with a generation over ``max_tokens`` (``rule="all"``: only if all of them are)."""
    if rule not in ("any", "all"):
        raise ValueError(f"rule must be 'any' or 'all', got {rule!r}")
    reduce = any if rule == "any" else all
    lengths = generation_token_lengths(df, tokenizer_path)
    too_long = [bool(ls) and reduce(n > max_tokens for n in ls) for ls in lengths]
    return df[~np.asarray(too_long, dtype=bool)]


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
    sample_size: int = 45_000,
    seed: int = 0,
    max_generation_tokens: int = 8192,
    length_rule: str = "any",
    template: str = DEFAULT_TEMPLATE,
    timeout_s: float = 5.0,
) -> dict:
    """Run the whole pipeline, write ``output`` (parquet) and ``<output>.stats.json``; return the stats."""
    output = Path(output)
    if output.resolve() in {Path(p).resolve() for p in inputs}:
        raise ValueError(f"output {output} is one of the inputs; choose another path")
    if "{question}" not in template:
        raise ValueError("the prompt template must contain '{question}'")
    df = load_openr1(inputs)
    stats: dict = {"input_rows": len(df), "removed": {}}
    steps = [
        ("no_verified_generation", filter_no_verified_generation),
        ("unparsable_answer", lambda d: filter_unparsable_answers(d, timeout_s)),
        ("long_generation", lambda d: filter_long_generations(d, tokenizer_path, max_generation_tokens, length_rule)),
    ]
    for name, step in steps:
        before = len(df)
        df = step(df)
        stats["removed"][name] = before - len(df)
        print(f"filter {name}: removed {before - len(df)} of {before} rows, {len(df)} left")
    stats["after_filters"] = len(df)
    if sample_size > len(df):
        raise ValueError(f"only {len(df)} rows survive the filters, fewer than --sample-size {sample_size}")
    df = df.sample(n=sample_size, random_state=seed).reset_index(drop=True)
    out = to_verl_rows(df, template)
    stats.update(sample_size=sample_size, seed=seed, max_generation_tokens=max_generation_tokens, output=str(output))
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    out.to_parquet(tmp, index=False)
    os.replace(tmp, output)
    output.with_name(output.name + ".stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats
