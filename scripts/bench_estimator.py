"""Time one call of our estimators against verl's `grpo` and `grpo_vectorized` on the same inputs, side by side.

Each repeat runs every estimator back to back on the same batch (in a rotating order), so machine noise hits them
alike; the table shows medians and the ratios ours / verl. A call here is the whole token-level face that verl calls:
sequence sums, group statistics, weights, blend, metrics, history update. The per-prompt histories (``spo``, BV-Blend
``prompt_and_cluster``) first track a pool of prompts (``--prompt-pool``, the paper's 45,000 by default), and each
batch draws its prompts from it; ``--state-size`` also prints their state's size in memory and on disk.

    python scripts/bench_estimator.py                     # BV-Blend at the issue's sizes, response length 1024
    python scripts/bench_estimator.py --sizes 16x8 --repeats 50
    python scripts/bench_estimator.py --estimators spo bv_blend_prompt --sizes 1024x2 128x1 --state-size
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import numpy as np
import torch
from tqdm import tqdm

from bv_blend import BVBlendConfig, BVBlendEstimator, SPOEstimator
from instruments.machine import describe_cpu

DEFAULT_SIZES = ("16x8", "256x8", "1024x16", "4096x16")
ESTIMATORS = ("bv_blend", "spo", "bv_blend_prompt")


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


def build(name: str, num_clusters: int) -> object:
    if name == "spo":
        return SPOEstimator()
    if name == "bv_blend_prompt":
        return BVBlendEstimator(num_clusters, BVBlendConfig(history_level="prompt_and_cluster"))
    return BVBlendEstimator(num_clusters)


def face(name: str, estimator: object, token_rewards, mask, index, clusters, keys):
    """The call verl's registered function makes for estimator ``name``."""
    if name == "spo":
        return lambda: estimator.compute_token_level(token_rewards, mask, index, keys)
    if name == "bv_blend_prompt":
        return lambda: estimator.compute_token_level(token_rewards, mask, index, clusters, prompt_keys=keys)
    return lambda: estimator.compute_token_level(token_rewards, mask, index, clusters)


def prompt_keys(prompts: int, rollouts: int, pool: int, seed: int) -> np.ndarray:
    """Each row's prompt key: ``prompts`` distinct prompts of the pool, ``rollouts`` rows each."""
    chosen = np.random.default_rng(seed).choice(pool, size=min(prompts, pool), replace=False)
    return np.repeat(np.array([f"prompt-{i:06d}" for i in chosen], dtype=object), rollouts)


def track_pool(estimator: object, name: str, pool: int, num_clusters: int) -> None:
    """Visit every prompt of the pool once (batches of 1,024), so the state holds what a 45k-prompt epoch leaves."""
    if name == "bv_blend":
        return
    for start in range(0, pool, 1024):
        rows = min(1024, pool - start)
        keys = np.array([f"prompt-{i:06d}" for i in range(start, start + rows)], dtype=object)
        rewards = torch.from_numpy((np.arange(rows) % 3 == 0).astype(np.float64))
        clusters = torch.from_numpy(np.arange(rows) % num_clusters)
        if name == "spo":
            estimator.compute(rewards, keys, keys)
        else:
            estimator.compute(rewards, keys, clusters, prompt_keys=keys)


def bench_size(prompts: int, rollouts: int, length: int, repeats: int, num_clusters: int, names: list[str],
               pool: int) -> dict[str, float]:  # fmt: skip
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn  # verl takes seconds to import: after the checks

    token_rewards, mask, index, clusters = make_batch(prompts, rollouts, length, num_clusters, seed=prompts)
    keys = prompt_keys(prompts, rollouts, pool, seed=prompts)
    grpo, grpo_vectorized = get_adv_estimator_fn("grpo"), get_adv_estimator_fn("grpo_vectorized")
    calls = {
        "grpo": lambda: grpo(token_level_rewards=token_rewards, response_mask=mask, index=index),
        "grpo_vectorized": lambda: grpo_vectorized(token_level_rewards=token_rewards, response_mask=mask, index=index),
    }
    for name in names:
        estimator = build(name, num_clusters)
        track_pool(estimator, name, pool, num_clusters)
        calls[name] = face(name, estimator, token_rewards, mask, index, clusters, keys)
        calls[name]()  # history exists from here on
    for call in calls.values():  # warm-up: first-call allocations and lazy imports
        call()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    for repeat in range(repeats):
        shift = repeat % len(order)
        for name in order[shift:] + order[:shift]:
            start = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


def state_size(name: str, pool: int, num_clusters: int) -> tuple[int, int]:
    """(bytes in memory, bytes on disk) of an estimator's state after tracking ``pool`` prompts."""
    import io
    import sys

    estimator = build(name, num_clusters)
    track_pool(estimator, name, pool, num_clusters)
    table = estimator.tracker if name == "spo" else estimator.prompts.table
    memory = table.values.nbytes + sys.getsizeof(table.keys) + sum(sys.getsizeof(k) for k in table.keys)
    memory += sys.getsizeof(table._row) + sum(sys.getsizeof(v) for v in table._row.values())
    buffer = io.BytesIO()
    torch.save(estimator.state_dict(), buffer)
    return memory, buffer.tell()


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
    parser.add_argument("--estimators", nargs="+", choices=ESTIMATORS, default=["bv_blend"])
    parser.add_argument("--prompt-pool", type=int, default=45000, help="prompts the per-prompt histories track")
    parser.add_argument("--state-size", action="store_true", help="also print the per-prompt state's size")
    args = parser.parse_args(argv)
    for flag, value in (("--response-length", args.response_length), ("--repeats", args.repeats),
                        ("--num-clusters", args.num_clusters), ("--threads", args.threads),
                        ("--prompt-pool", args.prompt_pool)):
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
        medians = bench_size(prompts, rollouts, args.response_length, repeats, args.num_clusters, args.estimators,
                             args.prompt_pool)  # fmt: skip
        rows_out.append((size, prompts * rollouts, repeats, medians))

    threads, length = torch.get_num_threads(), args.response_length
    print(f"\nmedian seconds per call, response length {length}, torch threads {threads}, {describe_cpu()}")
    names = args.estimators
    print("| size | rows | reps | grpo | grpo_vec | " + " | ".join(names) + " | "
          + " | ".join(f"{n}/grpo_vec" for n in names) + " |")
    print("|" + "---|" * (5 + 2 * len(names)))
    for size, rows, repeats, m in rows_out:
        ours = " | ".join(f"{m[n]:.5f}" for n in names)
        ratios = " | ".join(f"{m[n] / m['grpo_vectorized']:.2f}" for n in names)
        print(f"| {size} | {rows} | {repeats} | {m['grpo']:.5f} | {m['grpo_vectorized']:.5f} | {ours} | {ratios} |")
    if args.state_size:
        for name in (n for n in names if n != "bv_blend"):
            memory, disk = state_size(name, args.prompt_pool, args.num_clusters)
            print(f"{name} state for {args.prompt_pool} prompts: {memory / 2**20:.1f} MiB in memory, "
                  f"{disk / 2**20:.1f} MiB on disk (torch.save)")


if __name__ == "__main__":
    main()
