#!/usr/bin/env python
"""Build a BV-Blend codebook from verl parquet files and write annotated copies plus a report.

    python scripts/build_codebook.py data/train.parquet --num-clusters 64 --out-dir data/codebook_k64

writes data/codebook_k64/{codebook.npz, train.parquet (extra_info.bv_blend_cluster), report.md,
report.json, cluster_sizes.png}. Embeddings are cached, so a re-run with another K only re-fits.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

from bv_blend.codebook.annotate import ALGORITHMS, build_codebook_from_parquet, check_build_options
from bv_blend.codebook.encode import DEFAULT_ENCODER, TextEncoder


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", help="verl-format parquet files (e.g. from examples/data_preprocess)")
    parser.add_argument("--out-dir", required=True, help="where the codebook, annotated copies and report go")
    parser.add_argument("-k", "--num-clusters", type=int, required=True, help="K, the number of clusters")
    parser.add_argument("--seed", type=int, default=0, help="K-means seed (default 0)")
    parser.add_argument(
        "--text-field", default=None, help="dotted field with the problem text, e.g. extra_info.question "
        "(default: the last user message of 'prompt', shared instruction stripped)"
    )
    parser.add_argument(
        "--strip-instruction", default="auto",
        help="'auto' (strip the prefix/suffix all prompts share), 'none', or the exact instruction text",
    )
    parser.add_argument("--encoder", default=DEFAULT_ENCODER, help="sentence-transformers name or local path")
    default_cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bv_blend"
    parser.add_argument("--cache-dir", default=str(default_cache), help="embedding cache (default %(default)s)")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write the embedding cache")
    parser.add_argument("--batch-size", type=int, default=64, help="encoder batch size")
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="kmeans")
    parser.add_argument("--examples-per-cluster", type=int, default=3)
    parser.add_argument("--overwrite-inputs", action="store_true", help="allow --out-dir to be the inputs' folder")
    args = parser.parse_args(argv)
    # What can be checked without reading a file, before anything is loaded (the inputs are read, and K checked
    # against the number of prompts, before the encoder loads).
    try:
        check_build_options(args.num_clusters, args.algorithm, args.examples_per_cluster)
    except ValueError as exc:
        parser.error(str(exc))
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    strip = None if args.strip_instruction == "none" else args.strip_instruction
    # The encoder (a model load) is made only once the inputs are read and checked.
    encoder = functools.partial(
        TextEncoder, args.encoder, cache_dir=None if args.no_cache else args.cache_dir, batch_size=args.batch_size
    )
    try:
        result = build_codebook_from_parquet(
            args.inputs,
            args.out_dir,
            args.num_clusters,
            seed=args.seed,
            text_field=args.text_field,
            strip=strip,
            encoder=encoder,
            algorithm=args.algorithm,
            examples_per_cluster=args.examples_per_cluster,
            overwrite_inputs=args.overwrite_inputs,
        )
    except (ValueError, KeyError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    book = result.codebook
    print(f"codebook: {result.codebook_path} (K={book.num_clusters}, D={book.dim}, {book.train_count} prompts, "
          f"sizes {min(book.cluster_sizes)}..{max(book.cluster_sizes)}, hash {book.content_hash[:12]})")
    print(f"embedding cache hits: {result.cache_hits}/{book.train_count}")
    for path in result.annotated_paths:
        print(f"annotated: {path}")
    print(f"report: {result.report_paths['md']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
