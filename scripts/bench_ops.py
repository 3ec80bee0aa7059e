"""The per-operation costs behind the estimator's design, side by side in one run (docs/estimator.md).

1. Warm: small operations on a vector of 64 float64, in torch against numpy.
2. Cold: the first use of an entry point right after verl's loop `grpo` has run, as in a trainer step:
   `.any()`/`.all()`/`.min()` against `np.count_nonzero`, and `tensor.device` against `tensor.is_cpu`.

    python scripts/bench_ops.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from bench_estimator import make_batch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn


def warm_us(call: Callable[[], object], loops: int = 20000) -> float:
    """Best of five timings of ``loops`` calls, in microseconds per call."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(loops):
            call()
        best = min(best, (time.perf_counter() - start) / loops)
    return best * 1e6


def cold_us(calls: dict[str, Callable[[], object]], repeats: int = 200) -> dict[str, float]:
    """Median microseconds of each call when it runs right after verl's loop `grpo` on a 16x8 batch."""
    token_rewards, mask, index, _ = make_batch(16, 8, 1024, 64, seed=0)
    grpo = get_adv_estimator_fn("grpo")
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            grpo(token_level_rewards=token_rewards, response_mask=mask, index=index)
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1e6 for name, values in seconds.items()}


def main() -> None:
    vector, tensor = np.random.default_rng(0).random(64), torch.rand(64, dtype=torch.float64)
    print("warm, one small op on 64 float64 (us per call):      torch   numpy")
    warm = {
        "x * 2.0": (lambda: tensor * 2.0, lambda: vector * 2.0),
        "x + 1.0": (lambda: tensor + 1.0, lambda: vector + 1.0),
        "where(x > 0.5, x, 0.0)": (
            lambda: torch.where(tensor > 0.5, tensor, 0.0),
            lambda: np.where(vector > 0.5, vector, 0.0),
        ),
        "sqrt(x)": (lambda: tensor.sqrt(), lambda: np.sqrt(vector)),
    }
    for name, (torch_call, numpy_call) in warm.items():
        print(f"  {name:48s} {warm_us(torch_call):6.2f}  {warm_us(numpy_call):6.2f}")

    flags = vector > 0.5
    mask = torch.ones(128, 1024)
    cold = cold_us(
        {
            "flags.any()": lambda: flags.any(),
            "flags.all()": lambda: flags.all(),
            "vector.min()": lambda: vector.min(),
            "np.count_nonzero(flags)": lambda: np.count_nonzero(flags),
            "mask.device.type": lambda: mask.device.type,
            "mask.is_cpu": lambda: mask.is_cpu,
            "nothing (timer floor)": lambda: None,
        }
    )
    print("cold, first use right after verl's loop grpo (median us):")
    for name, value in cold.items():
        print(f"  {name:24s} {value:6.1f}")


if __name__ == "__main__":
    main()
