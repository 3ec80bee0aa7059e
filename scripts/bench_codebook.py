#!/usr/bin/env python
"""Benchmark the offline codebook pipeline and print the figures recorded in docs/codebook.md.

    python scripts/bench_codebook.py --n 45000 --ratio-n 3000 --cache-dir /tmp/bv_bench_cache

1. Encoding throughput of bv_blend's TextEncoder (length-sorted chunks, cache writes, progress bar)
   against a bare ``SentenceTransformer.encode`` over the same ``--ratio-n`` texts, run side by
   side and alternated (two rounds each) so machine load hits both alike.
2. K-means seconds for K in {64, 256} on the ``--n`` prompt embeddings (scikit-learn KMeans, the
   default, and MiniBatchKMeans). The embeddings come through the on-disk cache, so a re-run does
   not re-encode.
3. Assignment time of one 16-prompt batch (ClusterAssigner: encode + nearest centroid), median.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bv_blend.codebook import fit_codebook
from bv_blend.codebook.encode import ClusterAssigner, EmbeddingCache, TextEncoder

TEMPLATES = [
    "What is {a} + {b} * {c}?",
    "Find all real x such that x^2 - {s}x + {p} = 0.",
    "A rectangle has perimeter {a} and area {b}. Find the length of its diagonal.",
    "How many positive divisors does {n} have?",
    "Compute the remainder when {a}^{b} is divided by {c}.",
    "A bag contains {a} red balls and {b} blue balls. Two are drawn without replacement. "
    "What is the probability that both are red?",
    "Let f(x) = {a}x^3 - {b}x + {c}. Find f'({d}).",
    "In triangle ABC, AB = {a}, BC = {b} and angle B = {deg} degrees. Find AC.",
    "Evaluate the sum of the first {n} terms of the arithmetic sequence starting {a}, {b}, ...",
    "Solve the system: {a}x + {b}y = {c}, {d}x - y = {s}.",
    "How many ways can {a} people be seated around a round table if two of them refuse to sit together?",
    "Find the minimum value of x^2 + {a}/x for x > 0.",
    "The sequence a_1 = {a}, a_(n+1) = {b}a_n - {c}. Find a_{d}.",
    "A circle of radius {a} is inscribed in a square. What is the area between them?",
    "Prove that {n} cannot be written as the sum of two squares, or find such a representation.",
    "Find the number of integer solutions of |x| + |y| <= {a}.",
]
WORDS = ["carefully", "exactly", "in simplest form", "as a fraction", "to the nearest integer", ""]


def synthetic_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct math-competition-like problems from templates with random numbers."""
    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        v = {k: rng.randint(2, 99) for k in "abcdps"} | {"n": rng.randint(10, 5000), "deg": rng.choice([30, 45, 60])}
        v["d"] = rng.randint(1, 9)
        text = rng.choice(TEMPLATES).format(**v)
        if (tail := rng.choice(WORDS)) != "":
            text = f"{text} Give the answer {tail}."
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def bench_encoding(texts: list[str], batch_size: int) -> None:
    with tempfile.TemporaryDirectory() as cache_dir:
        ours = TextEncoder(cache_dir=cache_dir, batch_size=batch_size, show_progress=False)
        model = ours.model
        model.encode(texts[:64], batch_size=batch_size)  # warm up both code paths once
        times: dict[str, list[float]] = {"bare": [], "ours": []}
        for round_ in range(2):
            for name in ("bare", "ours") if round_ == 0 else ("ours", "bare"):
                ours.cache.close()
                ours.cache = EmbeddingCache(Path(cache_dir) / f"{name}{round_}.sqlite")  # empty: every text is a miss
                start = time.perf_counter()
                if name == "bare":
                    model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True)
                else:
                    ours.encode(texts)
                times[name].append(time.perf_counter() - start)
        ours.cache.close()
        ours.cache = EmbeddingCache(Path(cache_dir) / "ours1.sqlite")  # filled by the last "ours" round
        start = time.perf_counter()
        ours.encode(texts)
        cached = time.perf_counter() - start
        assert ours.last_cache_hits == len(texts)
    bare, mine = min(times["bare"]), min(times["ours"])
    n = len(texts)
    print(f"encoding {n} texts, batch {batch_size} (best of 2, alternated):")
    print(f"  bare SentenceTransformer.encode : {bare:7.2f} s  {n / bare:7.1f} texts/s")
    print(f"  bv_blend TextEncoder (no hits)  : {mine:7.2f} s  {n / mine:7.1f} texts/s")
    print(f"  ratio ours / bare (throughput)  : {bare / mine:7.3f}x")
    print(f"  bv_blend TextEncoder (all cached): {cached:6.2f} s  {n / cached:7.1f} texts/s")


def bench_kmeans(embeddings: np.ndarray, ks: list[int], encoder_id: str) -> dict:
    books = {}
    print(f"K-means on {embeddings.shape[0]} x {embeddings.shape[1]} embeddings (seed 0, n_init=1):")
    for k in ks:
        for algorithm in ("kmeans", "minibatch"):
            start = time.perf_counter()
            book = fit_codebook(embeddings, k, encoder_id=encoder_id, seed=0, algorithm=algorithm)
            seconds = time.perf_counter() - start
            sizes = np.asarray(book.cluster_sizes)
            inertia = float(np.mean(2 - 2 * np.max(embeddings @ book.centroids.T, axis=1)))
            print(f"  K={k:4d} {algorithm:9s}: {seconds:7.2f} s  mean sq. dist {inertia:.4f}  "
                  f"sizes {sizes.min()}..{sizes.max()} (empty {int((sizes == 0).sum())})")
            books[(k, algorithm)] = book
    return books


def bench_assignment(book, texts: list[str], repeats: int) -> None:
    encoder = TextEncoder(book.encoder_id, show_progress=False)  # no cache: every batch is encoded
    assigner = ClusterAssigner(book, encoder)
    assigner.assign_texts(texts[:16])
    times = []
    for r in range(repeats):
        batch = texts[16 * (r + 1) : 16 * (r + 2)]
        start = time.perf_counter()
        assigner.assign_texts(batch)
        times.append(time.perf_counter() - start)
    emb = encoder.encode(texts[:16])
    start = time.perf_counter()
    for _ in range(100):
        book.assign(emb)
    nearest = (time.perf_counter() - start) / 100
    print(f"assignment of a 16-prompt batch, K={book.num_clusters} ({repeats} batches): "
          f"median {1000 * statistics.median(times):.1f} ms, max {1000 * max(times):.1f} ms "
          f"(nearest-centroid step alone {1e6 * nearest:.0f} us)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=45_000, help="prompts for K-means")
    parser.add_argument("--ratio-n", type=int, default=3000, help="prompts for the side-by-side encoding ratio")
    parser.add_argument("--ks", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--cache-dir", default=None, help="embedding cache for the --n prompts (re-runs skip encoding)")
    parser.add_argument("--assign-batches", type=int, default=30)
    parser.add_argument("--skip-encoding-ratio", action="store_true")
    args = parser.parse_args(argv)
    for flag, value in (("--n", args.n), ("--ratio-n", args.ratio_n), ("--batch-size", args.batch_size),
                        ("--assign-batches", args.assign_batches), *(("--ks", k) for k in args.ks)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}.")
    if args.ratio_n > args.n or max(args.ks) > args.n:
        parser.error(f"--ratio-n ({args.ratio_n}) and every --ks ({args.ks}) must be at most --n ({args.n}).")

    import torch

    print(f"torch threads: {torch.get_num_threads()}")
    texts = synthetic_prompts(args.n)
    if not args.skip_encoding_ratio:
        bench_encoding(texts[: args.ratio_n], args.batch_size)
    encoder = TextEncoder(cache_dir=args.cache_dir, batch_size=args.batch_size)
    start = time.perf_counter()
    embeddings = encoder.encode(texts)
    print(f"embeddings for {args.n} prompts: {time.perf_counter() - start:.1f} s "
          f"({encoder.last_cache_hits} from cache)")
    books = bench_kmeans(embeddings, args.ks, encoder.encoder_id)
    unseen = synthetic_prompts(args.n + 16 * (args.assign_batches + 2), seed=0)[args.n :]
    bench_assignment(books[(max(args.ks), "kmeans")], unseen, args.assign_batches)


if __name__ == "__main__":
    main()
