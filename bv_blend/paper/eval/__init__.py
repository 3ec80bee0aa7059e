"""The paper's evaluation suite: benchmarks, answer extraction, option permutation, metrics and the table.

Generation with vLLM lives in :mod:`bv_blend.eval.generate`, imported only when a model is evaluated.
"""

from bv_blend.paper.eval.benchmarks import BENCHMARKS, Benchmark, Problem, load_problems
from bv_blend.paper.eval.extract import extract_boxed, extract_choice
from bv_blend.paper.eval.metrics import avg_at_k, mean_pass_at_k, pass_at_k
from bv_blend.paper.eval.permute import permute_options
from bv_blend.paper.eval.suite import build_request, evaluate, judge, load_scores, save_scores, score_benchmark
from bv_blend.paper.eval.table import results_table, to_markdown, write_table

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "Problem",
    "avg_at_k",
    "build_request",
    "evaluate",
    "extract_boxed",
    "extract_choice",
    "judge",
    "load_problems",
    "load_scores",
    "mean_pass_at_k",
    "pass_at_k",
    "permute_options",
    "results_table",
    "save_scores",
    "score_benchmark",
    "to_markdown",
    "write_table",
]
