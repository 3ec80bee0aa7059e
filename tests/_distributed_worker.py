"""One rank of the multi-process test: runs the same calls on its share of whole groups (gloo, CPU)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from bv_blend import BVBlendConfig, BVBlendEstimator

NUM_CLUSTERS = 5


def make_calls(seed: int, num_calls: int = 4, binary: bool = True, never_varies: bool = False):
    """Global batches: groups of varying size in random clusters (some -1), rows shuffled.

    ``never_varies``: clusters 0 and 1 get only all-wrong and all-right groups until the last call, where one group
    of cluster 0 has one success, so that the variance floor and the auto clip act (spec 5 step 8).
    """
    rng = np.random.default_rng(seed)
    calls = []
    for call in range(num_calls):
        # Call 1 has few groups, so that with 4 ranks some rank holds no row at all.
        num_groups = 2 if call == 1 else int(rng.integers(3, 12))
        rewards, uids, clusters, groups = [], [], [], []
        for group in range(num_groups):
            size = int(rng.integers(1, 9))
            cluster = int(rng.integers(-1, NUM_CLUSTERS))
            values = rng.integers(0, 2, size) if binary else rng.normal(size=size)
            if never_varies and group < 2:
                size, cluster, values = 8, group, np.full(8, group)
                if group == 0 and call == num_calls - 1:
                    values = np.eye(1, 8, int(rng.integers(8)))[0]
            elif never_varies and cluster in (0, 1):
                cluster = -1  # clusters 0 and 1 see only their constant groups
            rewards += values.astype(float).tolist()
            uids += [f"c{call}g{group}"] * size
            clusters += [cluster] * size
            groups += [group] * size
        order = rng.permutation(len(rewards))
        calls.append(
            (
                torch.tensor(rewards, dtype=torch.float32)[order],
                np.array(uids, dtype=object)[order],
                torch.tensor(clusters)[order],
                np.array(groups)[order],
            )
        )
    return calls


def call_options(binary: bool, never_varies: bool) -> dict:
    return {"binary": binary, "never_varies": never_varies, "num_calls": 12 if never_varies else 4}


def rows_of_rank(groups: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    return np.flatnonzero(groups % world_size == rank)


@contextmanager
def gloo_group(rank: int, world_size: int, init_file: str) -> Iterator[None]:
    # a rank left waiting in a collective fails the test within a minute instead of hanging it
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))  # fmt: skip
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_rank(rank: int, world_size: int, out_dir: str, seed: int, binary: bool, never_varies: bool = False) -> None:
    estimator = BVBlendEstimator(NUM_CLUSTERS, BVBlendConfig(temperature=0.5))
    results = []
    for rewards, uids, clusters, groups in make_calls(seed, **call_options(binary, never_varies)):
        rows = rows_of_rank(groups, rank, world_size)
        if len(rows):
            # A rank with rows also holds a padding row, as verl's balancing would add.
            local_rewards = torch.cat([rewards[rows], torch.tensor([1.0])])
            local_uids = np.concatenate([uids[rows], np.array([f"pad{rank}"], dtype=object)])
            local_clusters = torch.cat([clusters[rows], torch.tensor([0])])
            advantages = estimator.compute(local_rewards, local_uids, local_clusters)[:-1]
        else:  # an empty local batch must still join the collective
            advantages = estimator.compute(torch.zeros(0), np.array([], dtype=object), torch.zeros(0, dtype=torch.long))
        results.append({"rows": torch.from_numpy(rows), "advantages": advantages, "metrics": dict(estimator.metrics)})
    torch.save({"state": estimator.state_dict(), "results": results}, f"{out_dir}/rank{rank}.pt")


def prompt_keys_of(uids: np.ndarray) -> np.ndarray:
    """One prompt per group, the same in every call: the group's index (its uid without the call's)."""
    return np.array([uid.split("g")[1] for uid in uids], dtype=object)


def run_rank_with_a_bad_call(
    rank: int, world_size: int, out_dir: str, seed: int, history_level: str = "cluster"
) -> None:
    """Call 0 is good everywhere; in call 1 rank 1 holds a NaN reward; call 2 is good again."""
    estimator = BVBlendEstimator(NUM_CLUSTERS, BVBlendConfig(temperature=0.5, history_level=history_level))
    calls = make_calls(seed, num_calls=3)
    states, errors = [], []
    for call, (rewards, uids, clusters, groups) in enumerate(calls):
        rows = rows_of_rank(groups, rank, world_size)
        local_rewards = rewards[rows].clone()
        if call == 1 and rank == 1:
            local_rewards[0] = float("nan")
        try:
            estimator.compute(local_rewards, uids[rows], clusters[rows], prompt_keys=prompt_keys_of(uids[rows]))
            errors.append(None)
        except ValueError as error:
            errors.append(str(error))
        states.append(estimator.state_dict())
    torch.save({"states": states, "errors": errors}, f"{out_dir}/rank{rank}.pt")


def spo_calls(seed: int) -> list:
    """SPO's calls: make_calls' 0/1 groups keyed by prompt (a prompt comes back in later calls), and on the last
    call rank 1's first reward out of [0, 1] (the rejection the other rank must hear of)."""
    return [(rewards, uids, np.array([f"p{g % 4}" for g in groups], dtype=object), groups)
            for rewards, uids, _, groups in make_calls(seed, num_calls=4)]  # fmt: skip


def run_spo_rank(rank: int, world_size: int, out_dir: str, seed: int) -> None:
    from bv_blend import SPOEstimator

    estimator, results = SPOEstimator(), []
    calls = spo_calls(seed)
    for call, (rewards, uids, keys, groups) in enumerate(calls):
        rows = rows_of_rank(groups, rank, world_size)
        local = rewards[rows].clone()
        if call == len(calls) - 1 and rank == 1:
            local[0] = 2.0
        try:
            advantages, error = estimator.compute(local, uids[rows], keys[rows]), None
        except ValueError as exc:
            advantages, error = None, str(exc)
        results.append({"rows": torch.from_numpy(rows), "advantages": advantages, "error": error,
                        "metrics": dict(estimator.metrics), "state": estimator.state_dict()})  # fmt: skip
    torch.save(results, f"{out_dir}/rank{rank}.pt")


def run_cases(rank: int, world_size: int, init_file: str, cases: list[tuple[Callable[..., None], str, tuple]]) -> None:
    """Every case of one world size in one process group, each writing to its own folder: starting the processes and
    the group costs far more than the cases (each case builds its own estimators, so none sees another's state)."""
    with gloo_group(rank, world_size, init_file):
        for run, out_dir, args in cases:
            run(rank, world_size, out_dir, *args)
