"""bv-blend codebook: build a codebook from verl parquet files and write annotated copies plus a report.

    bv-blend codebook ~/data/train.parquet --num-clusters 64 --out-dir ~/data/k64

writes ~/data/k64/{codebook.npz, train.parquet (extra_info.bv_blend_cluster), report.md, report.json,
cluster_sizes.png}. Train on the annotated copy with algorithm.bv_blend.codebook_path=$HOME/data/k64/codebook.npz.
Embeddings are cached, so a re-run with another K only re-fits. docs/codebook.md.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from types import ModuleType

from bv_blend.cli.errors import CommandError
from bv_blend.codebook.codebook import ALGORITHMS
from bv_blend.codebook.encode import DEFAULT_ENCODER

SUMMARY = "build a codebook and annotate the training parquet files with each prompt's cluster"


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bv_blend"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", help="verl-format parquet files (from verl's examples/data_preprocess)")
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
    parser.add_argument("--cache-dir", default=str(default_cache_dir()), help="embedding cache (default %(default)s)")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write the embedding cache")
    parser.add_argument("--batch-size", type=int, default=64, help="encoder batch size")
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="kmeans",
                        help="kmeans (default: K=64 over 45k prompts in seconds) or minibatch (far larger corpora)")
    parser.add_argument("--examples-per-cluster", type=int, default=3, help="prompts per cluster in the report")
    parser.add_argument("--overwrite-inputs", action="store_true", help="allow --out-dir to be the inputs' folder")


def _annotate() -> ModuleType:
    """The codebook builder, imported only when a build runs: it needs pyarrow, of the ``codebook`` extra, and
    ``bv-blend --help`` or ``bv-blend doctor`` must work without it."""
    try:
        from bv_blend.codebook import annotate
    except ImportError as exc:
        extra = "pip install 'bv-blend[codebook]'"
        raise CommandError(f"building a codebook needs the codebook extra ({exc}): {extra}") from exc
    return annotate


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The arguments, with what can be checked without reading a file checked (``parser.error`` exits 2)."""
    args = parser.parse_args(argv)
    try:
        _annotate().check_build_options(args.num_clusters, args.algorithm, args.examples_per_cluster)
    except ValueError as exc:
        parser.error(str(exc))
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}.")
    return args


def run(args: argparse.Namespace) -> int:
    # Missing inputs are named before anything is read or loaded (the library reads every input, and checks K
    # against the prompts, before the encoder loads).
    for path in map(Path, args.inputs):
        if not path.is_file():
            raise CommandError(f"input {path} does not exist or is not a file: give the training parquet files "
                               "in verl's format (e.g. written by verl's examples/data_preprocess/gsm8k.py).")
    strip = None if args.strip_instruction == "none" else args.strip_instruction
    annotate = _annotate()
    cache_dir = None if args.no_cache else args.cache_dir
    encoder = functools.partial(annotate.TextEncoder, args.encoder, cache_dir=cache_dir, batch_size=args.batch_size)
    try:
        result = annotate.build_codebook_from_parquet(
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
            on_stage=lambda message: print(f"[codebook] {message}", file=sys.stderr, flush=True),
        )
    # the library's messages name the file or option and the fix; ImportError names the missing extra
    except (ValueError, KeyError, OSError, ImportError) as exc:
        raise CommandError(str(exc)) from exc
    book = result.codebook
    print(f"codebook: {result.codebook_path} (K={book.num_clusters}, D={book.dim}, {book.train_count} prompts, "
          f"sizes {min(book.cluster_sizes)}..{max(book.cluster_sizes)}, hash {book.content_hash[:12]})")
    print(f"embedding cache hits: {result.cache_hits}/{book.train_count}")
    for path in result.annotated_paths:
        print(f"annotated: {path}")
    print(f"report: {result.report_paths['md']}")
    # absolute: verl's trainer rarely runs from this folder
    annotated = ",".join(str(p.resolve()) for p in result.annotated_paths)
    codebook = result.codebook_path.resolve()
    print(f"train with: data.train_files=[{annotated}] algorithm.bv_blend.codebook_path={codebook}")
    return 0
