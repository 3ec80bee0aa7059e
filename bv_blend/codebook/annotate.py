"""Offline pipeline: verl parquet files -> codebook + annotated copies + a report a person can judge.

Everything is validated (files readable and non-empty, text field present, K <= prompts, output
paths distinct from the inputs) before the first file is written, so bad input changes nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bv_blend.codebook.codebook import ALGORITHMS, CLUSTER_KEY, Codebook, fit_codebook
from bv_blend.codebook.encode import TextEncoder, extract_problem_texts
from bv_blend.codebook.parquet import read_parquet


@dataclass
class BuildResult:
    codebook: Codebook
    codebook_path: Path
    annotated_paths: list[Path]
    report_paths: dict[str, Path]
    texts: list[str] = field(repr=False)
    cluster_ids: np.ndarray = field(repr=False)
    cache_hits: int = 0  # prompts whose embedding came from the encoder's on-disk cache


def check_build_options(num_clusters: int, algorithm: str = "kmeans", examples_per_cluster: int = 3) -> None:
    """The options of a build that can be checked before any file is read (``bv-blend codebook`` calls it
    before it loads the encoder)."""
    if isinstance(num_clusters, bool) or not isinstance(num_clusters, int) or num_clusters < 1:
        raise ValueError(f"K (--num-clusters) must be a positive integer, got {num_clusters!r}.")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}.")
    if examples_per_cluster < 0:
        raise ValueError(f"examples per cluster must be >= 0, got {examples_per_cluster}.")


def read_verl_parquet(path: str | os.PathLike, field_name: str | None) -> pa.Table:
    """Read one verl parquet file, checking that it has rows and the column the text comes from."""
    column = field_name.split(".")[0] if field_name else "prompt"
    hint = "pass --text-field (e.g. extra_info.question)" if not field_name else "check --text-field"
    table = read_parquet(path, [column], what="the text", hint=hint)
    if table.num_rows == 0:
        raise ValueError(f"{path} has no rows; remove it from the inputs")
    return table


def _rows_for_text(table: pa.Table, field_name: str | None) -> list[dict]:
    column = field_name.split(".")[0] if field_name else "prompt"
    return table.select([column]).to_pylist()


def add_cluster_ids(table: pa.Table, cluster_ids: np.ndarray) -> pa.Table:
    """``table`` with ``extra_info[CLUSTER_KEY]`` = the ids (replacing an old value); other data untouched."""
    ids = pa.array(np.asarray(cluster_ids, dtype=np.int64), type=pa.int64())
    if len(ids) != table.num_rows:
        raise ValueError(f"{len(ids)} cluster ids for a table of {table.num_rows} rows")
    if "extra_info" not in table.column_names:
        return table.append_column("extra_info", pa.StructArray.from_arrays([ids], names=[CLUSTER_KEY]))
    column = table.column("extra_info").combine_chunks()
    if not pa.types.is_struct(column.type):
        raise ValueError(f"extra_info column has type {column.type}, expected a struct; cannot add {CLUSTER_KEY}")
    # flatten() merges the parent's nulls into the children: a null extra_info row becomes a struct
    # of nulls plus the id, so no row loses its cluster.
    kept = [(f.name, child) for f, child in zip(column.type, column.flatten(), strict=True) if f.name != CLUSTER_KEY]
    names, children = [n for n, _ in kept], [c for _, c in kept]
    struct = pa.StructArray.from_arrays([*children, ids], names=[*names, CLUSTER_KEY])
    return table.set_column(table.column_names.index("extra_info"), "extra_info", struct)


def _output_paths(inputs: Sequence[Path], out_dir: Path, overwrite_inputs: bool) -> list[Path]:
    outs = [out_dir / p.name for p in inputs]
    if len({o.resolve() for o in outs}) != len(outs):
        raise ValueError("two inputs share a file name; annotate them into separate output directories")
    clashes = [o for o in outs if o.resolve() in {p.resolve() for p in inputs}]
    if clashes and not overwrite_inputs:
        raise ValueError(
            f"annotated output {clashes[0]} would overwrite an input; "
            "choose another --out-dir or pass --overwrite-inputs"
        )
    return outs


def _write_parquet_atomic(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def build_codebook_from_parquet(
    inputs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    num_clusters: int,
    *,
    seed: int = 0,
    text_field: str | None = None,
    strip: str | None = "auto",
    encoder: TextEncoder | Callable[[], TextEncoder] | None = None,
    algorithm: str = "kmeans",
    examples_per_cluster: int = 3,
    overwrite_inputs: bool = False,
    codebook_name: str = "codebook.npz",
    on_stage: Callable[[str], None] | None = None,
) -> BuildResult:
    """Build a codebook from verl parquet files, write annotated copies and a report into ``out_dir``.

    ``encoder`` is a :class:`TextEncoder`, a function that makes one (called only once the inputs are read and
    checked, so bad input never waits for a model to load), or ``None`` for the default encoder. ``on_stage`` hears
    one line as each stage starts: the encoder has its own progress bar, but loading it and the K-means fit (about a
    minute for 45k prompts on a loaded machine) would otherwise be silent.
    """
    stage = on_stage or (lambda message: None)
    check_build_options(num_clusters, algorithm, examples_per_cluster)
    paths = [Path(p) for p in inputs]
    if not paths:
        raise ValueError("no input parquet files given")
    out = Path(out_dir)
    out_paths = _output_paths(paths, out, overwrite_inputs)
    tables = [read_verl_parquet(p, text_field) for p in paths]
    rows = [row for t in tables for row in _rows_for_text(t, text_field)]
    texts, prefix, suffix = extract_problem_texts(rows, text_field, strip)
    if num_clusters > len(texts):
        raise ValueError(
            f"K={num_clusters} is larger than the number of prompts ({len(texts)}); use --num-clusters <= {len(texts)}"
        )
    stage(f"{len(texts)} prompts from {len(paths)} file(s); loading the encoder")
    if not isinstance(encoder, TextEncoder):
        encoder = (encoder or TextEncoder)()
    embeddings = encoder.encode(texts)
    cache_hits = encoder.last_cache_hits
    stage(f"fitting {algorithm} with K={num_clusters} over {embeddings.shape[0]} x {embeddings.shape[1]} embeddings")
    book = fit_codebook(
        embeddings,
        num_clusters,
        encoder_id=encoder.encoder_id,
        seed=seed,
        algorithm=algorithm,
        text_field=text_field,
        strip_prefix=prefix,
        strip_suffix=suffix,
    )
    ids = book.assign(embeddings)
    stage(f"writing the codebook, {len(out_paths)} annotated file(s) and the report into {out}")
    out.mkdir(parents=True, exist_ok=True)
    codebook_path = book.save(out / codebook_name)
    start = 0
    for table, out_path in zip(tables, out_paths, strict=True):
        _write_parquet_atomic(add_cluster_ids(table, ids[start : start + table.num_rows]), out_path)
        start += table.num_rows
    report_paths = write_report(book, texts, ids, embeddings, out, examples_per_cluster=examples_per_cluster)
    return BuildResult(book, codebook_path, out_paths, report_paths, texts, ids, cache_hits)


def read_cluster_ids(path: str | os.PathLike) -> np.ndarray:
    """The ``extra_info[CLUSTER_KEY]`` column of an annotated parquet file, as int64."""
    table = pq.read_table(path, columns=["extra_info"])
    column = table.column("extra_info").combine_chunks()
    if not pa.types.is_struct(column.type) or column.type.get_field_index(CLUSTER_KEY) < 0:
        raise ValueError(f"{path} has no extra_info.{CLUSTER_KEY}; annotate it with `bv-blend codebook`")
    return np.asarray(column.field(CLUSTER_KEY).to_numpy(zero_copy_only=False), dtype=np.int64)


def _shorten(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"


def cluster_report(
    book: Codebook, texts: Sequence[str], ids: np.ndarray, embeddings: np.ndarray, examples_per_cluster: int = 3
) -> dict:
    """Sizes and, per cluster, the prompts nearest its centroid (the most typical members)."""
    sizes = np.bincount(ids, minlength=book.num_clusters)
    similarity = np.einsum("nd,nd->n", embeddings, book.centroids[ids])
    clusters = []
    for k in range(book.num_clusters):
        members = np.flatnonzero(ids == k)
        nearest = members[np.argsort(-similarity[members], kind="stable")[:examples_per_cluster]]
        clusters.append({"cluster": k, "size": int(sizes[k]), "examples": [texts[i] for i in nearest]})
    by_size = sorted(clusters, key=lambda c: (c["size"], c["cluster"]))
    few = min(5, book.num_clusters)
    return {
        "encoder_id": book.encoder_id,
        "num_clusters": book.num_clusters,
        "num_prompts": int(len(ids)),
        "seed": book.seed,
        "content_hash": book.content_hash,
        "stripped_prefix": book.strip_prefix,
        "stripped_suffix": book.strip_suffix,
        "size_min": int(sizes.min()),
        "size_median": float(np.median(sizes)),
        "size_max": int(sizes.max()),
        "empty_clusters": int((sizes == 0).sum()),
        "smallest": [c["cluster"] for c in by_size[:few]],
        "largest": [c["cluster"] for c in by_size[::-1][:few]],
        "clusters": clusters,
    }


def _markdown(report: dict) -> str:
    lines = [
        "# Codebook report",
        "",
        f"- encoder: `{report['encoder_id']}`, K = {report['num_clusters']}, prompts = {report['num_prompts']}, "
        f"seed = {report['seed']}",
        f"- cluster size: min {report['size_min']}, median {report['size_median']:g}, max {report['size_max']}, "
        f"empty clusters {report['empty_clusters']}",
        f"- stripped shared instruction: prefix {report['stripped_prefix']!r}, suffix {report['stripped_suffix']!r}",
        f"- content hash: `{report['content_hash'][:16]}`",
        "",
        "![cluster sizes](cluster_sizes.png)",
        "",
    ]
    by_id = {c["cluster"]: c for c in report["clusters"]}
    for title, key in (("Smallest clusters", "smallest"), ("Largest clusters", "largest")):
        lines += [f"## {title}", ""]
        for k in report[key]:
            lines.append(f"- **{k}** ({by_id[k]['size']} prompts): " + " | ".join(map(_shorten, by_id[k]["examples"])))
        lines.append("")
    lines += ["## All clusters (prompts nearest each centroid)", "", "| cluster | size | examples |", "|---|---|---|"]
    for c in report["clusters"]:
        examples = " <br> ".join(_shorten(e).replace("|", "\\|") for e in c["examples"])
        lines.append(f"| {c['cluster']} | {c['size']} | {examples} |")
    return "\n".join(lines) + "\n"


def _plot_sizes(sizes: Sequence[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(sizes, reverse=True)
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.bar(range(len(ordered)), ordered, width=1.0, color="#4c72b0")
    ax.axhline(float(np.mean(ordered)), color="#c44e52", lw=1, label=f"mean {np.mean(ordered):.1f}")
    ax.set(xlabel="cluster (sorted by size)", ylabel="prompts", title=f"Cluster sizes, K = {len(ordered)}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(
    book: Codebook,
    texts: Sequence[str],
    ids: np.ndarray,
    embeddings: np.ndarray,
    out_dir: Path,
    examples_per_cluster: int = 3,
) -> dict[str, Path]:
    """Write report.json, report.md and cluster_sizes.png into ``out_dir``."""
    report = cluster_report(book, texts, ids, embeddings, examples_per_cluster)
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "png": out_dir / "cluster_sizes.png"}
    paths["json"].write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    paths["md"].write_text(_markdown(report))
    _plot_sizes([c["size"] for c in report["clusters"]], paths["png"])
    return paths
