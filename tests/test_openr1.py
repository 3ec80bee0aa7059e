"""OpenR1-Math-220k -> verl pipeline on a fixture with the data set's real column schema."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bv_blend.codebook.encode import extract_problem_texts
from bv_blend.paper.data.openr1 import (
    DATA_SOURCE,
    INSTRUCTION,
    OPENR1_SCHEMA,
    filter_long_generations,
    generation_token_lengths,
    prepare_openr1,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import prepare_openr1_math  # noqa: E402  (the command-line face)
from _codebook_helpers import tiny_tokenizer_dir  # noqa: E402

MAX_TOKENS = 1000
LONG = "x " * 2000  # 2000 byte-level words: > MAX_TOKENS tokens under any BPE
GOOD = 12  # rows that survive every filter


def record(i: int, *, answer: str | None = None, verified=(True, False), generations=None, llama=None) -> dict:
    problem = f"Problem {i}: find the value of {i} + {i + 1}."
    gens = generations or [f"<think>{i}+{i + 1}</think> The answer is \\boxed{{{2 * i + 1}}}.", "short try"]
    return {
        "problem": problem,
        "solution": f"{i} + {i + 1} = {2 * i + 1}",
        "answer": str(2 * i + 1) if answer is None else answer,
        "problem_type": "Algebra",
        "question_type": "math-word-problem",
        "source": "olympiads",
        "uuid": f"uuid-{i:04d}",
        "is_reasoning_complete": [True] * len(gens),
        "generations": gens,
        "correctness_math_verify": list(verified),
        "correctness_llama": llama,  # null in most of the default split
        "finish_reasons": None,
        "correctness_count": sum(verified),
        "messages": [{"content": problem, "role": "user"}, {"content": gens[0], "role": "assistant"}],
    }


def fixture_rows() -> list[dict]:
    rows = [record(i, llama=[True, True] if i % 3 == 0 else None) for i in range(GOOD)]
    rows += [record(100, verified=(False, False)), record(101, verified=(False, False))]  # no verified generation
    rows += [record(200, answer="\\frac{1}{"), record(201, answer="")]  # answer Math-Verify cannot parse
    rows += [record(300, generations=[LONG, "short"]), record(301, generations=["ok", LONG])]  # one long gen
    return rows


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    """Two parquet shards with OpenR1-Math-220k's default-split schema."""
    folder = tmp_path_factory.mktemp("openr1")
    rows = fixture_rows()
    paths = []
    for n, part in enumerate((rows[::2], rows[1::2])):
        path = folder / f"train-0000{n}-of-00002.parquet"
        pq.write_table(pa.Table.from_pylist(part, schema=OPENR1_SCHEMA), path)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return tiny_tokenizer_dir(tmp_path_factory.mktemp("tok"))


def test_fixture_has_the_real_schema(shards):
    schema = pq.read_schema(shards[0])
    assert schema.names == [
        "problem", "solution", "answer", "problem_type", "question_type", "source", "uuid", "is_reasoning_complete",
        "generations", "correctness_math_verify", "correctness_llama", "finish_reasons", "correctness_count",
        "messages",
    ]
    assert schema.field("generations").type == pa.list_(pa.string())
    assert schema.field("messages").type == pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))


def test_each_filter_reports_what_it_removed_and_the_output_is_verl_format(shards, tokenizer, tmp_path, capsys):
    out = tmp_path / "train.parquet"
    stats = prepare_openr1(shards, out, tokenizer, sample_size=8, seed=0, max_generation_tokens=MAX_TOKENS)
    assert stats["input_rows"] == GOOD + 6
    assert stats["removed"] == {"no_verified_generation": 2, "unparsable_answer": 2, "long_generation": 2}
    assert stats["after_filters"] == GOOD
    printed = capsys.readouterr().out
    assert "filter unparsable_answer: removed 2 of 16 rows, 14 left" in printed
    assert json.loads(out.with_name("train.parquet.stats.json").read_text()) == stats

    df = pd.read_parquet(out)
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"] and len(df) == 8
    first = df.iloc[0]
    assert first["data_source"] == DATA_SOURCE and first["ability"] == "math"
    info, truth = first["extra_info"], first["reward_model"]
    assert list(first["prompt"]) == [{"role": "user", "content": f"{info['question']} {INSTRUCTION}"}]
    assert truth == {"style": "rule", "ground_truth": info["answer"]}
    assert sorted(df["extra_info"].map(lambda e: e["index"])) == list(range(8))
    assert set(df["extra_info"].map(lambda e: int(e["uuid"][5:]))) <= set(range(GOOD))


def test_sample_is_seeded(shards, tokenizer, tmp_path):
    def uuids(seed: int, name: str) -> list[str]:
        prepare_openr1(shards, tmp_path / name, tokenizer, sample_size=8, seed=seed, max_generation_tokens=MAX_TOKENS)
        return [e["uuid"] for e in pd.read_parquet(tmp_path / name)["extra_info"]]

    assert uuids(0, "a.parquet") == uuids(0, "b.parquet")
    assert uuids(0, "a.parquet") != uuids(1, "c.parquet")


def test_prepared_prompts_give_back_the_question_for_clustering(shards, tokenizer, tmp_path):
    """build_codebook's default extraction strips the template's instruction, leaving the OpenR1 problem."""
    out = tmp_path / "t.parquet"
    prepare_openr1(shards, out, tokenizer, sample_size=8, max_generation_tokens=MAX_TOKENS)
    df = pd.read_parquet(out)
    texts, _, suffix = extract_problem_texts(df.to_dict("records"))
    assert suffix.strip() == INSTRUCTION
    assert texts == [e["question"] for e in df["extra_info"]]


def test_length_filter_counts_tokens_with_the_given_tokenizer(tokenizer):
    df = pd.DataFrame({"generations": [["short", "also short"], [LONG, "short"], [LONG, LONG]]})
    lengths = generation_token_lengths(df, tokenizer)
    assert lengths[0][0] < 10 and lengths[1][0] > MAX_TOKENS and len(lengths[2]) == 2
    assert len(filter_long_generations(df, tokenizer, MAX_TOKENS, rule="any")) == 1
    assert len(filter_long_generations(df, tokenizer, MAX_TOKENS, rule="all")) == 2


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("missing_column", r"lacks OpenR1-Math-220k columns \['generations'\]"),
        ("empty", "hold no rows"),
        ("too_few", "only 12 rows survive the filters, fewer than --sample-size 50"),
        ("bad_template", "must contain '{question}'"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(case, match, shards, tokenizer, tmp_path):
    inputs, kwargs = list(shards), {"sample_size": 8, "max_generation_tokens": MAX_TOKENS}
    if case in ("missing_column", "empty"):
        rows = fixture_rows()[:3] if case == "missing_column" else []
        table = pa.Table.from_pylist(rows, schema=OPENR1_SCHEMA)
        if case == "missing_column":
            table = table.drop_columns(["generations"])
        inputs = [tmp_path / "bad.parquet"]
        pq.write_table(table, inputs[0])
    elif case == "too_few":
        kwargs["sample_size"] = 50
    else:
        kwargs["template"] = "no placeholder"
    out = tmp_path / "out.parquet"
    with pytest.raises(ValueError, match=match):
        prepare_openr1(inputs, out, tokenizer, **kwargs)
    assert not out.exists()


def test_missing_tokenizer_path_is_a_clear_error(shards, tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer path .* does not exist"):
        prepare_openr1(shards, tmp_path / "o.parquet", tmp_path / "nope", sample_size=8)


def test_command_line(shards, tokenizer, tmp_path):
    out = tmp_path / "cli.parquet"
    argv = [*map(str, shards), "--output", str(out), "--tokenizer", str(tokenizer), "--sample-size", "5"]
    assert prepare_openr1_math.main([*argv, "--max-generation-tokens", str(MAX_TOKENS)]) == 0
    assert len(pd.read_parquet(out)) == 5
    assert prepare_openr1_math.main([*argv[:-1], "500"]) == 2
