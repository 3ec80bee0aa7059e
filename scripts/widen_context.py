#!/usr/bin/env python
"""Write a 16k-window copy of a local Qwen2.5-Math model: the backbone the paper's main config trains.

    python scripts/widen_context.py --model ~/models/Qwen2.5-Math-7B --out ~/models/Qwen2.5-Math-7B-16k

The copy's config.json says rope_theta 40000 and max_position_embeddings 16384 (sliding_window null), as the
paper's lineage (LUFFY) did; the weights and tokenizer are symlinked (--copy copies them), so it takes no space
and downloads nothing. Then train with --model ~/models/Qwen2.5-Math-7B-16k (configs/paper/qwen25_math_7b.yaml:
1024 + 8192 tokens). The stock 4k model goes with configs/paper/qwen25_math_7b_4k.yaml. docs/paper_recipe.md
explains why a copy and not verl's override_config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bv_blend.paper.context_window import LINEAGE_MAX_POSITIONS, LINEAGE_ROPE_THETA, widen_context


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="local Hugging Face model folder (the source)")
    parser.add_argument("--out", type=Path, required=True, help="new folder for the widened copy")
    parser.add_argument("--rope-theta", type=float, default=LINEAGE_ROPE_THETA)
    parser.add_argument("--max-position-embeddings", type=int, default=LINEAGE_MAX_POSITIONS)
    parser.add_argument("--copy", action="store_true", help="copy the weight files instead of symlinking them")
    args = parser.parse_args(argv)
    if args.rope_theta <= 0 or args.max_position_embeddings < 1:
        parser.error("--rope-theta and --max-position-embeddings must be positive.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = widen_context(
            args.model, args.out, rope_theta=args.rope_theta,
            max_position_embeddings=args.max_position_embeddings, copy=args.copy,
        )
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, changes in result.changes.items():
        for key, (old, new) in changes.items():
            print(f"{name}: {key}: {old!r} -> {new!r}")
    how, names = ("copied", result.copied) if args.copy else ("linked", result.linked)
    print(f"{how} {len(names)} other entries: {', '.join(names)}")
    print(f"wrote {result.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
