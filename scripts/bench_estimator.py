"""Time one BV-Blend call against verl's `grpo` and `grpo_vectorized` on the same inputs, side by side.

Each repeat runs the three estimators back to back on the same batch (in a rotating order), so machine noise
hits them alike; the table shows medians and the ratios BV-Blend / verl. A BV-Blend call here is the whole
token-level face that verl calls: sequence sums, group statistics, weights, blend, metrics, history update.

    python scripts/bench_estimator.py                     # the issue's sizes, response length 1024
    python scripts/bench_estimator.py --sizes 16x8 --repeats 50
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import numpy as np
import torch
from tqdm import tqdm

from bv_blend import BVBlendEstimator

DEFAULT_SIZES = ("16x8", "256x8", "1024x16", "4096x16")


def make_batch(prompts: int, rollouts: int, length: int, num_clusters: int, seed: int):
    """verl-shaped inputs: uuid strings per prompt, 50% binary rewards on the last token, varying lengths."""
    rng = np.random.default_rng(seed)
    rows = prompts * rollouts
    uids = np.array([str(uuid.UUID(int=int(rng.integers(2**63)))) for _ in range(prompts)], dtype=object)
    index = np.repeat(uids, rollouts)
    lengths = torch.from_numpy(rng.integers(length // 4, length + 1, rows))
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.float32)
    token_rewards = torch.zeros(rows, length)
    token_rewards[torch.arange(rows), lengths - 1] = torch.from_numpy(rng.integers(0, 2, rows).astype(np.float32))
    clusters = torch.from_numpy(np.repeat(rng.integers(0, num_clusters, prompts), rollouts))
    return token_rewards, mask, index, clusters


def bench_size(prompts: int, rollouts: int, length: int, repeats: int, num_clusters: int) -> dict[str, float]:
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn  # verl takes seconds to import: after the checks

    token_rewards, mask, index, clusters = make_batch(prompts, rollouts, length, num_clusters, seed=prompts)
    estimator = BVBlendEstimator(num_clusters)
    estimator.compute_token_level(token_rewards, mask, index, clusters)  # history exists from here on
    grpo, grpo_vectorized = get_adv_estimator_fn("grpo"), get_adv_estimator_fn("grpo_vectorized")
    calls = {
        "bv_blend": lambda: estimator.compute_token_level(token_rewards, mask, index, clusters),
        "grpo": lambda: grpo(token_level_rewards=token_rewards, response_mask=mask, index=index),
        "grpo_vectorized": lambda: grpo_vectorized(token_level_rewards=token_rewards, response_mask=mask, index=index),
    }
    for call in calls.values():  # warm-up: first-call allocations and lazy imports
        call()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for repeat in range(repeats):
        for name in names[repeat % 3 :] + names[: repeat % 3]:
            start = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


def default_repeats(rows: int) -> int:
    return 5 if rows >= 16384 else 60 if rows >= 2048 else 300


def parse_size(size: str) -> tuple[int, int]:
    """``"256x8"`` -> (256, 8); an error that names the expected form otherwise."""
    parts = size.lower().split("x")
    if len(parts) != 2 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(f"size {size!r} must be PROMPTSxROLLOUTS with positive integers, e.g. 256x8")
    return int(parts[0]), int(parts[1])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=parse_size, default=[parse_size(s) for s in DEFAULT_SIZES],
                        help="PROMPTSxROLLOUTS, e.g. 256x8")
    parser.add_argument("--response-length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per size (default: by size)")
    parser.add_argument("--num-clusters", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    for flag, value in (("--response-length", args.response_length), ("--repeats", args.repeats),
                        ("--num-clusters", args.num_clusters), ("--threads", args.threads)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}.")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    rows_out = []
    for prompts, rollouts in tqdm(args.sizes, desc="sizes"):
        size = f"{prompts}x{rollouts}"
        repeats = args.repeats or default_repeats(prompts * rollouts)
        medians = bench_size(prompts, rollouts, args.response_length, repeats, args.num_clusters)
        rows_out.append((size, prompts * rollouts, repeats, medians))

    print(f"\nmedian seconds per call, response length {args.response_length}, torch threads {torch.get_num_threads()}")
    header = f"| {'size':>8} | {'rows':>6} | {'reps':>4} | {'grpo':>10} | {'grpo_vec':>10} | {'bv_blend':>10} |"
    print(header + " bv/grpo_vec | bv/grpo |")
    print("|" + "---|" * 8)
    for size, rows, repeats, m in rows_out:
        vs_vectorized, vs_loop = m["bv_blend"] / m["grpo_vectorized"], m["bv_blend"] / m["grpo"]
        print(
            f"| {size:>8} | {rows:>6} | {repeats:>4} | {m['grpo']:>10.5f} | {m['grpo_vectorized']:>10.5f} | "
            f"{m['bv_blend']:>10.5f} | {vs_vectorized:>11.2f} | {vs_loop:>7.3f} |"
        )


if __name__ == "__main__":
    main()
