#!/usr/bin/env python
"""Build the paper's training set from local OpenR1-Math-220k parquet files (default split).

    python scripts/prepare_openr1_math.py ~/data/openr1/data/train-*.parquet \
        --tokenizer ~/models/Qwen2.5-Math-7B --output ~/data/openr1_math_45k/train.parquet

Filters (each prints how many rows it removed): no generation verified by Math-Verify, reference
answer Math-Verify cannot parse/verify, a generation over 8192 tokens; then a seeded 45,000-row
sample in verl's format. Writes <output> and <output>.stats.json.
"""

from __future__ import annotations

import argparse
import json
import sys

from bv_blend.paper.data.openr1 import DEFAULT_TEMPLATE, prepare_openr1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", help="OpenR1-Math-220k parquet shards (data/train-*.parquet)")
    parser.add_argument("--output", required=True, help="output verl parquet file")
    parser.add_argument("--tokenizer", required=True, help="local path of the policy model / tokenizer")
    parser.add_argument("--sample-size", type=int, default=45_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-generation-tokens", type=int, default=8192)
    parser.add_argument(
        "--length-rule", choices=["any", "all"], default="any",
        help="drop a row if any (default) / all of its generations exceed the limit",
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
