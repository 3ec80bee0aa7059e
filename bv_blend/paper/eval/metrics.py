"""The paper's metrics: avg@k (mean accuracy over k samples per problem) and pass@k (unbiased estimator)."""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from ``n`` samples of which ``c`` are correct (Chen et al., 2021).

    pass@1 is c / n.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int = 1) -> float:
    """pass@k averaged over problems; ``correct[i]`` holds problem i's per-sample verdicts."""
    if not correct:
        raise ValueError("no problems to score")
    return sum(pass_at_k(len(row), sum(map(bool, row)), k) for row in correct) / len(correct)


def avg_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """avg@k: each problem's accuracy over its k samples, averaged over problems.

    Every problem must have exactly k samples (a short row means generation went wrong).
    """
    if not correct:
        raise ValueError("no problems to score")
    bad = [i for i, row in enumerate(correct) if len(row) != k]
    if bad:
        raise ValueError(f"avg@{k} needs {k} samples per problem; problems {bad[:5]} have {len(correct[bad[0]])}.")
    return sum(sum(map(bool, row)) / k for row in correct) / len(correct)
