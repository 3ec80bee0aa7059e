"""End to end on small verl parquet fixtures: real MiniLM, real K-means, annotated copies, report, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bv_blend.cli import main as bv_blend_command
from bv_blend.codebook import CLUSTER_KEY, Codebook
from bv_blend.codebook.annotate import add_cluster_ids, build_codebook_from_parquet, read_cluster_ids
from bv_blend.codebook.encode import ClusterAssigner, TextEncoder

INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
TOPICS = {
    "arithmetic": ["What is {a} plus {b}?", "Compute {a} times {b}.", "Subtract {b} from {a}."],
    "geometry": [
        "A rectangle is {a} cm by {b} cm. What is its area?",
        "Find the perimeter of a square with side {a}.",
        "A circle has radius {a}. What is its circumference?",
    ],
    "probability": [
        "A bag has {a} red and {b} blue balls. What is the probability of drawing red?",
        "Two dice are rolled. What is the probability that the sum is {a}?",
        "A coin is flipped {a} times. What is the chance of exactly {b} heads?",
    ],
}


def verl_frame(questions: list[str], split: str = "train") -> pd.DataFrame:
    """Rows shaped like verl's examples/data_preprocess/gsm8k.py output."""
    return pd.DataFrame(
        {
            "data_source": ["openai/gsm8k"] * len(questions),
            "prompt": [[{"role": "user", "content": f"{q} {INSTRUCTION}"}] for q in questions],
            "ability": ["math"] * len(questions),
            "reward_model": [{"style": "rule", "ground_truth": str(i)} for i in range(len(questions))],
            "extra_info": [
                {"split": split, "index": i, "question": q, "answer": str(i)} for i, q in enumerate(questions)
            ],
        }
    )


def questions(seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for templates in TOPICS.values():
        for t in templates:
            a, b = rng.integers(2, 30, size=2)
            out.append(t.format(a=a, b=b))
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("verl_data")
    paths = []
    for seed, name in ((0, "train.parquet"), (1, "more.parquet")):
        path = folder / name
        verl_frame(questions(seed) + questions(seed + 10)).to_parquet(path, index=False)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> TextEncoder:
    """The real packaged all-MiniLM-L6-v2, loaded once for this module, with a module-wide cache."""
    return TextEncoder(cache_dir=tmp_path_factory.mktemp("cache"), show_progress=False)


@pytest.fixture(scope="module")
def built(inputs, encoder, tmp_path_factory):
    return build_codebook_from_parquet(inputs, tmp_path_factory.mktemp("out"), 3, seed=0, encoder=encoder)


def test_codebook_annotated_copies_and_report_are_written(inputs, built):
    book = Codebook.load(built.codebook_path)
    assert book.content_hash == built.codebook.content_hash
    assert (book.num_clusters, book.dim, book.train_count) == (3, 384, 36)
    assert book.strip_suffix.strip() == INSTRUCTION  # the shared instruction was not clustered
    assert sum(book.cluster_sizes) == 36
    for src, dst in zip(inputs, built.annotated_paths, strict=True):
        original, annotated = pq.read_table(src), pq.read_table(dst)
        assert dst.name == src.name and dst != src
        for column in ("data_source", "prompt", "ability", "reward_model"):
            assert annotated.column(column).equals(original.column(column))
        extra = annotated.column("extra_info").to_pylist()
        for before, after in zip(original.column("extra_info").to_pylist(), extra, strict=True):
            assert {k: v for k, v in after.items() if k != CLUSTER_KEY} == before
    ids = np.concatenate([read_cluster_ids(p) for p in built.annotated_paths])
    assert np.array_equal(ids, built.cluster_ids)


def test_clusters_follow_the_topics(built):
    """The fixture has three topics; real MiniLM + K-means put each topic mostly in one cluster."""
    labels = np.array([i // 3 for i in range(9)] * 4)  # questions() lists 3 x 3 per topic, 4 times
    ids = built.cluster_ids
    purity = sum(np.bincount(ids[labels == t]).max() for t in range(3)) / len(ids)
    assert purity >= 0.8, f"topic purity {purity:.2f}"


def test_report_lists_sizes_extremes_and_examples(built):
    report = json.loads(built.report_paths["json"].read_text())
    sizes = [c["size"] for c in report["clusters"]]
    assert sizes == built.codebook.cluster_sizes and report["num_prompts"] == 36
    assert report["size_min"] == min(sizes) and report["size_max"] == max(sizes)
    assert sizes[report["smallest"][0]] == min(sizes) and sizes[report["largest"][0]] == max(sizes)
    for c in report["clusters"]:
        members = {t for t, k in zip(built.texts, built.cluster_ids, strict=True) if k == c["cluster"]}
        assert 1 <= len(c["examples"]) <= 3 and set(c["examples"]) <= members
    md = built.report_paths["md"].read_text()
    assert "Smallest clusters" in md and "Largest clusters" in md and report["clusters"][0]["examples"][0][:40] in md
    assert built.report_paths["png"].read_bytes()[:4] == b"\x89PNG"


def test_rebuild_is_deterministic_and_reuses_the_embedding_cache(inputs, encoder, built, tmp_path):
    again = build_codebook_from_parquet(inputs, tmp_path / "again", 3, seed=0, encoder=encoder)
    assert encoder.last_cache_hits == 36
    assert again.codebook.content_hash == built.codebook.content_hash
    assert np.array_equal(again.cluster_ids, built.cluster_ids)
    other_k = build_codebook_from_parquet(inputs, tmp_path / "k4", 4, seed=0, encoder=encoder)
    assert encoder.last_cache_hits == 36 and other_k.codebook.num_clusters == 4


def test_on_the_fly_assignment_agrees_with_the_offline_annotation(inputs, encoder, built):
    rows = pd.concat([pd.read_parquet(p) for p in inputs]).to_dict("records")
    ids = ClusterAssigner(built.codebook, encoder).assign_rows(rows)
    assert np.array_equal(ids, built.cluster_ids)


def test_text_field_option_clusters_extra_info_question(inputs, encoder, tmp_path):
    result = build_codebook_from_parquet(inputs, tmp_path, 3, text_field="extra_info.question", encoder=encoder)
    assert result.codebook.text_field == "extra_info.question" and result.texts[0] == questions(0)[0]


def test_add_cluster_ids_replaces_an_old_id_and_fills_null_extra_info():
    table = pa.table({"extra_info": pa.array([{"index": 0, CLUSTER_KEY: 9}, None], pa.struct(
        [("index", pa.int64()), (CLUSTER_KEY, pa.int64())]))})
    out = add_cluster_ids(table, np.array([1, 2]))
    assert out.column("extra_info").to_pylist() == [{"index": 0, CLUSTER_KEY: 1}, {"index": None, CLUSTER_KEY: 2}]
    bare = add_cluster_ids(pa.table({"x": [1, 2]}), np.array([0, 1]))
    assert bare.column("extra_info").to_pylist() == [{CLUSTER_KEY: 0}, {CLUSTER_KEY: 1}]


# ----------------------------------------------------------------------------- bad input changes nothing
def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_out_dir_equal_to_inputs_is_refused_unless_asked(inputs, encoder):
    folder = inputs[0].parent
    before = _snapshot(folder)
    with pytest.raises(ValueError, match="would overwrite an input"):
        build_codebook_from_parquet(inputs, folder, 3, encoder=encoder)
    assert _snapshot(folder) == before


def test_overwrite_inputs_when_asked(encoder, tmp_path):
    path = tmp_path / "data.parquet"
    verl_frame(questions(3)).to_parquet(path, index=False)
    result = build_codebook_from_parquet([path], tmp_path, 2, encoder=encoder, overwrite_inputs=True)
    assert np.array_equal(read_cluster_ids(path), result.cluster_ids)


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("missing_column", r"lacks the text columns \['prompt'\]"),
        ("missing_field", r"lacks the text columns \['meta'\]"),
        ("empty", "has no rows"),
        ("too_many_clusters", r"K=50 is larger than the number of prompts \(9\)"),
        ("not_parquet", "not a readable parquet file"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(case, match, encoder, tmp_path):
    src = tmp_path / "in" / "data.parquet"
    src.parent.mkdir()
    frame, k, field = verl_frame(questions(4)), 3, None
    if case == "missing_column":
        frame = frame.drop(columns=["prompt"])
    elif case == "missing_field":
        field = "meta.question"
    elif case == "empty":
        frame = frame.iloc[:0]
    elif case == "too_many_clusters":
        k = 50
    frame.to_parquet(src, index=False)
    if case == "not_parquet":
        src.write_text("not parquet")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=match):
        build_codebook_from_parquet([src], out, k, text_field=field, encoder=encoder)
    assert not out.exists()


def test_command_line_builds_and_reports_errors(inputs, tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["codebook", *map(str, inputs), "--out-dir", str(out), "-k", "2", "--cache-dir", str(tmp_path / "c")]
    assert bv_blend_command(argv) == 0
    assert Codebook.load(out / "codebook.npz").num_clusters == 2
    assert {"train.parquet", "more.parquet", "report.md", "report.json"} <= {p.name for p in out.iterdir()}
    assert bv_blend_command(argv[:-4] + ["-k", "500", "--no-cache"]) == 2
    assert "larger than the number of prompts" in capsys.readouterr().err
