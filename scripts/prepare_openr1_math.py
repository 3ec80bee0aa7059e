#!/usr/bin/env python
"""Build the paper's training set from local OpenR1-Math-220k parquet files (default split).

    python scripts/prepare_openr1_math.py ~/data/openr1/data/train-*.parquet \
        --tokenizer ~/models/Qwen2.5-Math-7B --output ~/data/openr1_math_45k/train.parquet

A problem is kept when some generation in the data set is correct by Math-Verify, has complete reasoning and
is at most 8192 tokens long (the paper's lineage, LUFFY's 46k subset), and its reference answer parses. Each
stage prints how many rows it removed; then a seeded 45,000-row sample is written in verl's format, with
<output>.stats.json beside it. --length-rule any|all applies the earlier row-level length rules instead
(any: drop a row if any generation is too long; all: only if every one is), for comparison.
"""

from __future__ import annotations

import argparse
import json
import sys

from bv_blend.paper.data.openr1 import DEFAULT_TEMPLATE, LENGTH_RULES, prepare_openr1


def sample_size(text: str) -> int | None:
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive row count or 'all', got {text!r}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", help="OpenR1-Math-220k parquet shards (data/train-*.parquet)")
    parser.add_argument("--output", required=True, help="output verl parquet file")
    parser.add_argument("--tokenizer", required=True, help="local path of the policy model / tokenizer")
    parser.add_argument("--sample-size", type=sample_size, default=45_000, help="rows to draw, or 'all'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-generation-tokens", type=int, default=8192)
    parser.add_argument(
        "--length-rule", choices=LENGTH_RULES, default="correct",
        help="correct (default, the paper's lineage): keep a row if some correct, complete generation fits; "
        "any / all: the earlier row-level rules over all generations (for comparison)",
    )
    parser.add_argument("--template", default=DEFAULT_TEMPLATE, help="user turn; must contain {question}")
    parser.add_argument("--verify-timeout", type=float, default=5.0, help="seconds per Math-Verify check")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        stats = prepare_openr1(
            args.inputs,
            args.output,
            args.tokenizer,
            sample_size=args.sample_size,
            seed=args.seed,
            max_generation_tokens=args.max_generation_tokens,
            length_rule=args.length_rule,
            template=args.template,
            timeout_s=args.verify_timeout,
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(stats, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
