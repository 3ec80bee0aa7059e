#!/usr/bin/env python
"""Evaluate trained models on the paper's benchmarks (vLLM, temperature 0.6) and build the results table.

    # the grader on each benchmark's own references first (CPU): how often it accepts the file's answers
    python scripts/evaluate.py self-check --bench minerva=data/eval/minerva_math.jsonl \\
        --bench gpqa_diamond=data/eval/gpqa_diamond.csv --bench aime25=aime2025-I.jsonl,aime2025-II.jsonl
    # one model (GPU): writes <out>/<run>/scores.json, <bench>.samples.jsonl and a one-row table
    python scripts/evaluate.py run --model ckpts/bv_blend_hf --run-name bv_blend --out results \\
        --bench math500=data/eval/math500.jsonl --bench aime24=data/eval/aime24.parquet ... \\
        [--samples math500=32] [--field olympiadbench.answer_field=answer] [--tensor-parallel-size 1]
    # several runs into the paper's table (CPU): results/table.md and results/table.csv
    python scripts/evaluate.py table --scores results/*/scores.json --out results/table
    # a maths benchmark as the trainer's validation parquet (data.val_files)
    python scripts/evaluate.py to-verl --bench math500=data/eval/math500.jsonl --out data/val/math500.parquet

Benchmarks (files as published: parquet, JSONL, JSON or CSV; bv_blend/paper/eval/benchmarks.py lists the layouts):
aime24, aime25, amc (avg@32 by default, the paper's lineage); math500, minerva, olympiadbench (pass@1); arc_c,
gpqa_diamond, mmlu_pro (multiple choice, options shuffled per problem with --seed, pass@1). --samples NAME=K
changes k.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from bv_blend.paper.eval import (
    evaluate,
    load_problems,
    load_scores,
    results_table,
    save_scores,
    self_check,
    self_check_table,
    to_markdown,
    write_table,
)
from bv_blend.paper.eval.benchmarks import parse_benchmark_args
from bv_blend.paper.eval.suite import to_verl_rows
from bv_blend.verl.context_budget import read_model_context


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="evaluate one model (needs vLLM and a GPU)")
    run.add_argument("--model", required=True, help="local Hugging Face model folder (e.g. a merged checkpoint)")
    run.add_argument("--run-name", required=True, help="the table row's name")
    run.add_argument("--bench", action="append", required=True, metavar="NAME=PATH[,PATH]",
                     help="a local benchmark file (several for one benchmark: comma-separated)")
    run.add_argument("--field", action="append", default=[], metavar="NAME.X_field=COLUMN", help="column mapping")
    run.add_argument("--samples", action="append", default=[], metavar="NAME=K", help="avg@K for that benchmark")
    run.add_argument("--out", type=Path, default=Path("results"))
    run.add_argument("--seed", type=int, default=0, help="sampling and option-permutation seed")
    run.add_argument("--temperature", type=float, default=0.6)
    run.add_argument("--top-p", type=float, default=1.0, help="1.0 as in the paper's lineage (LUFFY)")
    run.add_argument("--max-tokens", type=int, default=8192,
                     help="response budget: the training one (8192; 3072 for a 4k model such as the _4k config's)")
    run.add_argument("--max-model-len", type=int, default=None)
    run.add_argument("--tensor-parallel-size", type=int, default=1)
    run.add_argument("--limit", type=int, default=None, help="first N problems per benchmark (smoke tests)")
    table = sub.add_parser("table", help="combine runs' scores.json into the paper's table (markdown + CSV)")
    table.add_argument("--scores", nargs="+", type=Path, required=True)
    table.add_argument("--out", type=Path, default=Path("results/table"), help="output prefix (.md and .csv)")
    check = sub.add_parser("self-check", help="grade each benchmark's own references with our grader (CPU)")
    check.add_argument("--bench", action="append", required=True, metavar="NAME=PATH[,PATH]")
    check.add_argument("--field", action="append", default=[], metavar="NAME.X_field=COLUMN")
    check.add_argument("--seed", type=int, default=0, help="option-permutation seed (multiple choice)")
    check.add_argument("--limit", type=int, default=None, help="first N problems per benchmark")
    check.add_argument("--out", type=Path, default=None, help="write the rejected references here (JSONL)")
    to_verl = sub.add_parser("to-verl", help="write a maths benchmark as a verl validation parquet")
    to_verl.add_argument("--bench", required=True, metavar="NAME=PATH")
    to_verl.add_argument("--field", action="append", default=[], metavar="NAME.X_field=COLUMN")
    to_verl.add_argument("--out", type=Path, required=True, help="output .parquet")
    return parser.parse_args(argv)


def check_context(model: Path, max_tokens: int, max_model_len: int | None) -> None:
    """Refuse a response budget the model's context cannot hold (vLLM would cut every response short)."""
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"--model {model} has no config.json; pass a local Hugging Face model folder.")
    context = read_model_context(model)  # max_position_embeddings, read as verl reads it
    if max_model_len is not None and max_model_len > context.tokens:
        raise ValueError(f"--max-model-len {max_model_len} exceeds the model's context of {context.tokens} tokens "
                         f"({context.source}).")
    window = max_model_len or context.tokens
    if max_tokens >= window:
        raise ValueError(
            f"--max-tokens {max_tokens} leaves no room for the prompt in the {window}-token context of {model} "
            f"({context.source}); lower --max-tokens (3072 for a 4k model), or evaluate a copy of the model with a "
            "longer window (scripts/widen_context.py)."
        )


def run_self_check(args: argparse.Namespace) -> int:
    chosen = parse_benchmark_args(args.bench, args.field)
    loaded = [(bench, load_problems(bench, path, args.limit)) for bench, path in chosen.values()]
    results = [self_check(bench, problems, seed=args.seed) for bench, problems in loaded]
    print(self_check_table(results))
    failures = [f for r in results for f in r.failures]
    for failure in failures[:20]:
        print(f"rejected: {failure['benchmark']} {failure['id']} ({failure['check']}): gold {failure['gold']!r}, "
              f"last \\boxed{{}} {failure['last_boxed']!r}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(f) + "\n" for f in failures))
        print(f"wrote {len(failures)} rejected references to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "table":
            runs = dict(load_scores(path) for path in args.scores)
            md, csv = write_table(results_table(runs), args.out)
            print(md.read_text(), f"\nwrote {md} and {csv}")
            return 0
        if args.command == "self-check":
            return run_self_check(args)
        if args.command == "to-verl":
            ((bench, path),) = parse_benchmark_args([args.bench], args.field).values()
            args.out.parent.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(to_verl_rows(bench, load_problems(bench, path))).to_parquet(args.out)
            print(f"wrote {args.out}")
            return 0
        chosen = parse_benchmark_args(args.bench, args.field, args.samples)
        problems = {name: (bench, load_problems(bench, path, args.limit)) for name, (bench, path) in chosen.items()}
        if not Path(args.model).is_dir():
            raise FileNotFoundError(f"--model {args.model} is not a folder; pass a local Hugging Face model.")
        check_context(Path(args.model), args.max_tokens, args.max_model_len)
    except (ValueError, FileNotFoundError) as exc:  # ContextBudgetError is a ValueError
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
