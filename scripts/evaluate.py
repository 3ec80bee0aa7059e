#!/usr/bin/env python
"""Evaluate trained models on the paper's benchmarks (vLLM, temperature 0.6) and build the results table.

    # one model (GPU): writes <out>/<run>/scores.json, <bench>.samples.jsonl and a one-row table
    python scripts/evaluate.py run --model ckpts/bv_blend_hf --run-name bv_blend --out results \\
        --bench math500=data/eval/math500.jsonl --bench aime24=data/eval/aime24.parquet ... \\
        [--field olympiadbench.answer_field=answer] [--tensor-parallel-size 1]
    # several runs into the paper's table (CPU): results/table.md and results/table.csv
    python scripts/evaluate.py table --scores results/*/scores.json --out results/table
    # a maths benchmark as the trainer's validation parquet (data.val_files)
    python scripts/evaluate.py to-verl --bench math500=data/eval/math500.jsonl --out data/val/math500.parquet

Benchmarks: amc, math500 (avg@32); minerva, aime24, aime25, olympiadbench (pass@1); arc_c, gpqa_diamond,
mmlu_pro (multiple choice, options permuted with --seed, pass@1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from bv_blend.paper.eval import (
    evaluate,
    load_problems,
    load_scores,
    results_table,
    save_scores,
    to_markdown,
    write_table,
)
from bv_blend.paper.eval.benchmarks import parse_benchmark_args
from bv_blend.paper.eval.suite import to_verl_rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="evaluate one model (needs vLLM and a GPU)")
    run.add_argument("--model", required=True, help="local Hugging Face model folder (e.g. a merged checkpoint)")
    run.add_argument("--run-name", required=True, help="the table row's name")
    run.add_argument("--bench", action="append", required=True, metavar="NAME=PATH", help="a local benchmark file")
    run.add_argument("--field", action="append", default=[], metavar="NAME.X_field=COLUMN", help="column mapping")
    run.add_argument("--out", type=Path, default=Path("results"))
    run.add_argument("--seed", type=int, default=0, help="sampling and option-permutation seed")
    run.add_argument("--temperature", type=float, default=0.6)
    run.add_argument("--top-p", type=float, default=0.95)
    run.add_argument("--max-tokens", type=int, default=3072, help="response budget (the training one)")
    run.add_argument("--max-model-len", type=int, default=None)
    run.add_argument("--tensor-parallel-size", type=int, default=1)
    run.add_argument("--limit", type=int, default=None, help="first N problems per benchmark (smoke tests)")
    table = sub.add_parser("table", help="combine runs' scores.json into the paper's table (markdown + CSV)")
    table.add_argument("--scores", nargs="+", type=Path, required=True)
    table.add_argument("--out", type=Path, default=Path("results/table"), help="output prefix (.md and .csv)")
    to_verl = sub.add_parser("to-verl", help="write a maths benchmark as a verl validation parquet")
    to_verl.add_argument("--bench", required=True, metavar="NAME=PATH")
    to_verl.add_argument("--field", action="append", default=[], metavar="NAME.X_field=COLUMN")
    to_verl.add_argument("--out", type=Path, required=True, help="output .parquet")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "table":
            runs = dict(load_scores(path) for path in args.scores)
            md, csv = write_table(results_table(runs), args.out)
            print(md.read_text(), f"\nwrote {md} and {csv}")
            return 0
        if args.command == "to-verl":
            ((bench, path),) = parse_benchmark_args([args.bench], args.field).values()
            args.out.parent.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(to_verl_rows(bench, load_problems(bench, path))).to_parquet(args.out)
            print(f"wrote {args.out}")
            return 0
        chosen = parse_benchmark_args(args.bench, args.field)
        problems = {name: (bench, load_problems(bench, path, args.limit)) for name, (bench, path) in chosen.items()}
        if not Path(args.model).is_dir():
            raise FileNotFoundError(f"--model {args.model} is not a folder; pass a local Hugging Face model.")
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from bv_blend.paper.eval.generate import vllm_generator  # vLLM only now, once the inputs are known to be good

    generate = vllm_generator(
        args.model, temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed,
        tensor_parallel_size=args.tensor_parallel_size, max_model_len=args.max_model_len,
    )
    run_dir = args.out / args.run_name
    results = evaluate(problems, generate, seed=args.seed, out_dir=run_dir)
    settings = {k: str(v) for k, v in vars(args).items() if k not in ("command", "bench", "field")}
    save_scores(run_dir / "scores.json", args.run_name, results, settings)
    md, _ = write_table(results_table({args.run_name: {n: r.score for n, r in results.items()}}), run_dir / "table")
    print(to_markdown(results_table({args.run_name: {n: r.score for n, r in results.items()}})))
    print(f"wrote {run_dir}/scores.json and {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
