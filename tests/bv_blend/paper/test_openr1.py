"""OpenR1-Math-220k -> verl pipeline on a fixture with the data set's real 14-column schema.

The fixture (tests/fixtures/openr1/, written by tests/fixtures/make_fixtures.py) has one row per filter case;
its uuid names the case. Token counts use a tiny local byte-level BPE (about one token per byte), Math-Verify
is the real one.
"""

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
    KEPT,
    OPENR1_SCHEMA,
    STAGES,
    generation_token_lengths,
    has_short_candidate,
    load_openr1,
    prepare_openr1,
    row_fates,
)
from tests.fixtures.make_fixtures import OPENR1_CASES, OPENR1_MAX_TOKENS, OPENR1_PLAIN_ROWS, openr1_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import prepare_openr1_math  # noqa: E402  (the command-line face)

from tests._codebook_helpers import tiny_tokenizer_dir  # noqa: E402

SHARDS = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "openr1").glob("train-*.parquet"))
KEPT_ROWS = sum(case[-1] == KEPT for case in OPENR1_CASES.values()) + OPENR1_PLAIN_ROWS  # 4 + 8


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return tiny_tokenizer_dir(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return load_openr1(SHARDS)


@pytest.fixture(scope="module")
def fates(frame, tokenizer) -> dict[str, str]:
    result = row_fates(frame, tokenizer, max_generation_tokens=OPENR1_MAX_TOKENS)
    return dict(zip(frame["uuid"], result, strict=True))


def test_fixture_has_the_real_schema():
    assert len(SHARDS) == 2
    schema = pq.read_schema(SHARDS[0])
    assert schema.names == [
        "problem", "solution", "answer", "problem_type", "question_type", "source", "uuid", "is_reasoning_complete",
        "generations", "correctness_math_verify", "correctness_llama", "finish_reasons", "correctness_count",
        "messages",
    ]
    assert schema.equals(OPENR1_SCHEMA)


def test_fixture_generations_are_short_or_long_under_the_test_tokenizer(frame, tokenizer):
    lengths = [n for row in generation_token_lengths(frame, tokenizer) for n in row]
    assert all(n < OPENR1_MAX_TOKENS / 10 or n > 2 * OPENR1_MAX_TOKENS for n in lengths), lengths
    assert any(n > 2 * OPENR1_MAX_TOKENS for n in lengths)


@pytest.mark.parametrize("case", list(OPENR1_CASES))
def test_each_case_meets_its_fate(case, fates):
    assert fates[case] == OPENR1_CASES[case][-1]


def test_plain_rows_are_kept(fates):
    assert [fates[f"plain_{k}"] for k in range(OPENR1_PLAIN_ROWS)] == [KEPT] * OPENR1_PLAIN_ROWS


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        # the earlier row-level rules look at every generation's length, right or wrong, and not at completeness
        ("any", {"short_correct_beside_long_wrong": STAGES[3], "long_correct_only": STAGES[3],
                 "correct_but_incomplete": KEPT, "short_correct_only": KEPT, "no_correct": STAGES[0]}),
        ("all", {"short_correct_beside_long_wrong": KEPT, "long_correct_only": KEPT,
                 "correct_but_incomplete": KEPT, "short_correct_only": KEPT, "no_correct": STAGES[0]}),
    ],
)
def test_the_earlier_row_level_rules_stay_available(rule, expected, frame, tokenizer):
    result = row_fates(frame, tokenizer, max_generation_tokens=OPENR1_MAX_TOKENS, length_rule=rule)
    got = dict(zip(frame["uuid"], result, strict=True))
    assert {case: got[case] for case in expected} == expected


def test_correct_candidates_are_tokenized_shortest_first(tokenizer):
    """A row whose shortest correct generation fits costs one tokenization, however many others it has."""
    from transformers import AutoTokenizer

    real = AutoTokenizer.from_pretrained(str(tokenizer))
    seen: list[int] = []

    def counting(texts, **kwargs):
        seen.extend(len(t) for t in texts)
        return real(texts, **kwargs)

    long_text, short_text = "x " * 3000, "the answer is 3"
    found = has_short_candidate([[long_text, short_text, long_text], [long_text]], [[0, 1, 2], [0]], counting,
                                max_tokens=OPENR1_MAX_TOKENS)
    assert found == [True, False]
    assert sorted(seen) == sorted([len(short_text), len(long_text)])  # row 0: the short one only; row 1: its one


def test_stages_are_reported_and_written(tokenizer, tmp_path, capsys):
    out = tmp_path / "train.parquet"
    stats = prepare_openr1(SHARDS, out, tokenizer, sample_size=8, seed=0, max_generation_tokens=OPENR1_MAX_TOKENS)
    total = len(OPENR1_CASES) + OPENR1_PLAIN_ROWS
    expected_removed = {stage: sum(c[-1] == stage for c in OPENR1_CASES.values()) for stage in STAGES}
    assert stats["input_rows"] == total and stats["removed"] == expected_removed
    assert stats["after_filters"] == KEPT_ROWS and stats["sample_size"] == 8 and stats["length_rule"] == "correct"
    printed = capsys.readouterr().out
    left = total
    for stage in STAGES:  # every stage prints its count, in order
        removed = expected_removed[stage]
        assert f"filter {stage}: removed {removed} of {left} rows, {left - removed} left" in printed
        left -= removed
    assert json.loads(out.with_name("train.parquet.stats.json").read_text()) == stats


def test_output_is_verl_format(tokenizer, tmp_path):
    out = tmp_path / "train.parquet"
    prepare_openr1(SHARDS, out, tokenizer, sample_size=8, max_generation_tokens=OPENR1_MAX_TOKENS)
    df = pd.read_parquet(out)
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"] and len(df) == 8
    first = df.iloc[0]
    assert first["data_source"] == DATA_SOURCE and first["ability"] == "math"
    info, truth = first["extra_info"], first["reward_model"]
    assert list(first["prompt"]) == [{"role": "user", "content": f"{info['question']} {INSTRUCTION}"}]
    assert truth == {"style": "rule", "ground_truth": info["answer"]}
    assert sorted(df["extra_info"].map(lambda e: e["index"])) == list(range(8))
    kept = {case for case, c in OPENR1_CASES.items() if c[-1] == KEPT} | {f"plain_{k}" for k in range(8)}
    assert set(df["extra_info"].map(lambda e: e["uuid"])) <= kept


def test_sample_is_seeded_and_all_takes_every_row(tokenizer, tmp_path):
    def uuids(seed: int, name: str, size: int | None = 8) -> list[str]:
        prepare_openr1(SHARDS, tmp_path / name, tokenizer, sample_size=size, seed=seed,
                       max_generation_tokens=OPENR1_MAX_TOKENS)
        return [e["uuid"] for e in pd.read_parquet(tmp_path / name)["extra_info"]]

    assert uuids(0, "a.parquet") == uuids(0, "b.parquet")
    assert uuids(0, "a.parquet") != uuids(1, "c.parquet")
    assert len(uuids(0, "all.parquet", None)) == KEPT_ROWS


def test_prepared_prompts_give_back_the_question_for_clustering(tokenizer, tmp_path):
    """build_codebook's default extraction strips the template's instruction, leaving the OpenR1 problem."""
    out = tmp_path / "t.parquet"
    prepare_openr1(SHARDS, out, tokenizer, sample_size=8, max_generation_tokens=OPENR1_MAX_TOKENS)
    df = pd.read_parquet(out)
    texts, _, suffix = extract_problem_texts(df.to_dict("records"))
    assert suffix.strip() == INSTRUCTION
    assert texts == [e["question"] for e in df["extra_info"]]


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("missing_column", r"lacks OpenR1-Math-220k columns \['generations'\]"),
        ("empty", "hold no rows"),
        ("too_few", rf"only {KEPT_ROWS} of 20 rows survive the filters \(removed: no_correct_generation 2, "
                    rf"no_complete_correct_generation 2, unparsable_answer 2, no_short_correct_generation 2\), "
                    rf"fewer than --sample-size 50. Pass --sample-size {KEPT_ROWS} \(or 'all'\)"),
        ("bad_template", "must contain '{question}'"),
        ("misaligned", "row uuid=short_correct_only: 1 generations but 2 values in correctness_math_verify"),
        ("bad_rule", "length_rule must be one of correct, any, all"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(case, match, tokenizer, tmp_path):
    inputs, kwargs = list(SHARDS), {"sample_size": 8, "max_generation_tokens": OPENR1_MAX_TOKENS}
    if case in ("missing_column", "empty", "misaligned"):
        rows = openr1_rows()[:3] if case != "empty" else []
        if case == "misaligned":
            rows[2]["correctness_math_verify"] = [True, True]
        table = pa.Table.from_pylist(rows, schema=OPENR1_SCHEMA)
        if case == "missing_column":
            table = table.drop_columns(["generations"])
        inputs = [tmp_path / "bad.parquet"]
        pq.write_table(table, inputs[0])
    elif case == "too_few":
        kwargs["sample_size"] = 50
    elif case == "bad_rule":
        kwargs["length_rule"] = "some"
    else:
        kwargs["template"] = "no placeholder"
    out = tmp_path / "out.parquet"
    with pytest.raises(ValueError, match=match):
        prepare_openr1(inputs, out, tokenizer, **kwargs)
    assert not out.exists() and not out.with_name("out.parquet.stats.json").exists()


def test_missing_tokenizer_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer path .* does not exist"):
        prepare_openr1(SHARDS, tmp_path / "o.parquet", tmp_path / "nope", sample_size=8)


def test_command_line(tokenizer, tmp_path, capsys):
    out = tmp_path / "cli.parquet"
    argv = [*map(str, SHARDS), "--output", str(out), "--tokenizer", str(tokenizer),
            "--max-generation-tokens", str(OPENR1_MAX_TOKENS)]
    assert prepare_openr1_math.main([*argv, "--sample-size", "5"]) == 0
    assert len(pd.read_parquet(out)) == 5
    assert prepare_openr1_math.main([*argv, "--sample-size", "all"]) == 0
    assert len(pd.read_parquet(out)) == KEPT_ROWS
    capsys.readouterr()
    assert prepare_openr1_math.main([*argv, "--sample-size", "500"]) == 2
    assert f"fewer than --sample-size 500. Pass --sample-size {KEPT_ROWS}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prepare_openr1_math.main([*argv, "--sample-size", "-3"])


def test_fixture_files_are_what_the_generator_writes(tmp_path):
    from tests.fixtures.make_fixtures import write_all

    for path in write_all(tmp_path):
        if path.parent.name != "openr1":
            continue
        committed = Path(__file__).resolve().parents[2] / "fixtures" / "openr1" / path.name
        assert pq.read_table(path).equals(pq.read_table(committed)), "rerun tests/fixtures/make_fixtures.py"
