"""EMA reward moments per cluster (spec sections 4, 5.5-5.7) and per prompt (history_spec 3): BV-Blend's state.

Like a torchmetrics ``Metric``, the state is a few dense vectors, and a call folds a batch into them
through *sufficient statistics* that reduce by addition: per cluster k, S1_k = sum R, S2_k = sum R^2 and
n_k = row count. Because they add, several ranks that each hold whole groups agree on the state after one
all-reduce (sum) of the (3, K) statistics, whatever way the groups were split.

All state is float64: the sums are exact for 0/1 rewards, and for real-valued rewards the order in which
ranks or groups are summed changes the result by rounding only (about 1e-16 relative).

The state is held as host (numpy) arrays and leaves as torch tensors: ``state_dict`` gives plain tensors for
``torch.save``, and the cross-rank sync is a ``torch.distributed`` all-reduce of a tensor that shares the
statistics' memory (why numpy: docs/estimator.md, "Speed").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from bv_blend.history.table import PromptTable

NO_CLUSTER = -1
STATE_DTYPE = torch.float64
# Rows of the (3, K) sufficient-statistics array.
SUM, SUM_SQ, COUNT = 0, 1, 2
STATE_TENSORS = ("count", "mean", "second_moment", "seen")


def cluster_statistics(
    group_cluster: np.ndarray, group_sums: tuple[np.ndarray, np.ndarray, np.ndarray], num_clusters: int
) -> np.ndarray:
    """Per-cluster (S1, S2, n) of one call as a (3, K) float64 array, summed from the per-group ones.

    ``group_cluster`` holds each group's cluster, or -1 for a group whose rows must not count (no cluster,
    or no valid row): shifted by one, those land in slot 0, which is summed and then dropped.
    """
    slots = group_cluster + 1
    stats = np.empty((3, num_clusters))
    for row, sums in enumerate(group_sums):  # S1, S2, n: three statistics, not a loop over data
        stats[row] = np.bincount(slots, weights=sums, minlength=num_clusters + 1)[1:]
    return stats


def folded(
    moments: tuple[np.ndarray, np.ndarray, np.ndarray],
    seen: np.ndarray,
    stats: np.ndarray,
    decay: float,
    n0: float,
    v_prior: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N, m1, m2) after folding in (3, n) sufficient statistics: cold start where unseen, then the EMA.

    Cold start (spec 5.6): a cluster (or prompt) seen for the first time starts from the batch mean with a prior
    variance, worth n0 samples, so that one lucky batch cannot make it look certain. Then (spec 5.7)
    N' = decay N + n, m1' = (decay N m1 + S1) / N', m2' = (decay N m2 + S2) / N'; where N' = 0 (never seen) the zeros
    stay.
    """
    count, mean, second_moment = moments
    batch_sum, batch_sum_sq, batch_count = stats[SUM], stats[SUM_SQ], stats[COUNT]
    first_sighting = ~seen & (batch_count > 0)
    if first_sighting.any():  # rare once every cluster has been seen
        first_mean = batch_sum / np.maximum(batch_count, 1.0)
        count = np.where(first_sighting, n0, count)
        mean = np.where(first_sighting, first_mean, mean)
        second_moment = np.where(first_sighting, first_mean * first_mean + v_prior, second_moment)
    decayed = decay * count
    new_count = decayed + batch_count
    has_mass = new_count > 0
    new_mean = np.divide(decayed * mean + batch_sum, new_count, out=mean.copy(), where=has_mass)
    new_second = np.divide(decayed * second_moment + batch_sum_sq, new_count, out=second_moment.copy(), where=has_mass)
    return new_count, new_mean, new_second


class ClusterMoments:
    """EMA moments of the reward per cluster: N (effective sample size), m1 (mean), m2 (second raw moment).

    Args:
        num_clusters: K, the number of clusters of the codebook.
        gamma: EMA decay per call.
        n0: effective sample size that a cluster starts with at its first sighting.
        v_prior: variance that a cluster starts with at its first sighting.
    """

    def __init__(self, num_clusters: int, gamma: float, n0: float, v_prior: float) -> None:
        if isinstance(num_clusters, bool) or not isinstance(num_clusters, int) or num_clusters < 1:
            raise ValueError(f"num_clusters must be a positive int (the codebook's K), got {num_clusters!r}.")
        self.num_clusters = num_clusters
        self.gamma = gamma
        self.n0 = n0
        self.v_prior = v_prior
        self.count = np.zeros(num_clusters)
        self.mean = np.zeros(num_clusters)
        self.second_moment = np.zeros(num_clusters)
        self.seen = np.zeros(num_clusters, dtype=bool)

    def variance(self) -> np.ndarray:
        """v_k = max(m2_k - m1_k^2, 0): the historical variance per cluster."""
        return np.maximum(self.second_moment - self.mean * self.mean, 0.0)

    def fold(self, stats: np.ndarray) -> None:
        """Fold one call's (3, K) sufficient statistics into the state: cold start, then EMA (spec 5.6-5.7).

        Dense: every cluster ages by gamma; an absent one keeps its moments and loses weight. New arrays replace the
        old ones (nothing is written in place), so an array a caller holds never changes under it.
        """
        self.count, self.mean, self.second_moment = folded(
            (self.count, self.mean, self.second_moment), self.seen, stats, self.gamma, self.n0, self.v_prior
        )
        self.seen = self.seen | (stats[COUNT] > 0)

    def warm_start(self, pooled: np.ndarray, n0_prior: float) -> None:
        """Start each cluster with pooled prior scores (history_spec 4): N_k = n0_prior, m1_k and m2_k the pooled mean
        and mean square. ``pooled`` is (3, K) sums S1, S2, n of the scores of the cluster's prompts."""
        has = pooled[COUNT] > 0
        count = np.maximum(pooled[COUNT], 1.0)
        self.count = np.where(has, n0_prior, self.count)
        self.mean = np.where(has, pooled[SUM] / count, self.mean)
        self.second_moment = np.where(has, pooled[SUM_SQ] / count, self.second_moment)
        self.seen = self.seen | has

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state as plain CPU tensors (copies), float64 and bool."""
        return {name: torch.from_numpy(getattr(self, name).copy()) for name in STATE_TENSORS}

    def validate_state(self, state: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Check a saved state against this object's K, without changing anything; return clean copies."""
        missing = [name for name in STATE_TENSORS if name not in state]
        if missing:
            raise ValueError(
                f"BV-Blend state is missing {missing}; it was not written by BVBlendEstimator.state_dict()."
            )
        clean = {}
        for name in STATE_TENSORS:
            value = state[name]
            if not isinstance(value, torch.Tensor) or value.shape != (self.num_clusters,):
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(
                    f"BV-Blend state '{name}' must be a tensor of shape ({self.num_clusters},), got {shape}."
                )
            dtype = torch.bool if name == "seen" else STATE_DTYPE
            value = value.detach().to("cpu", dtype).numpy().copy()
            if name != "seen" and not np.isfinite(value).all():
                raise ValueError(f"BV-Blend state '{name}' holds NaN or infinite values; the file is corrupt.")
            clean[name] = value
        if (clean["count"] < 0).any():
            raise ValueError("BV-Blend state 'count' holds negative effective sample sizes; the file is corrupt.")
        return clean

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        clean = self.validate_state(state)
        for name, value in clean.items():
            setattr(self, name, value)


class PromptMoments:
    """BV-Blend's prompt level (history_spec 3): (N_p, m1_p, m2_p) per prompt key, for the prompts seen so far.

    They update once per visit, never once per call: a prompt comes back about once an epoch, and an EMA that aged
    every call would have forgotten it by then. A prompt in the table is *seen*; the cold start is a cluster's.

    Args:
        decay: rho_p, the decay per visit.
        n0: effective sample size at a prompt's first visit.
        v_prior: variance at a prompt's first visit.
    """

    COLUMNS = ("count", "mean", "second_moment")

    def __init__(self, decay: float, n0: float, v_prior: float) -> None:
        self.decay, self.n0, self.v_prior = decay, n0, v_prior
        self.table = PromptTable(self.COLUMNS, "BV-Blend prompt")

    def __len__(self) -> int:
        return len(self.table)

    def lookup(self, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(N, m1, m2, seen) of each key before this call; zeros and False for a prompt never seen."""
        rows = self.table.rows_of(keys)
        count, mean, second = (self.table.column(name, rows, 0.0) for name in self.COLUMNS)
        return count, mean, second, rows >= 0

    def fold(self, keys: Sequence[str], stats: np.ndarray) -> None:
        """Fold a call's visits into the table: the visited ``keys`` (distinct) with their (3, n) sums S1, S2, n."""
        rows = self.table.rows_of(keys)
        count, mean, second = (self.table.column(name, rows, 0.0) for name in self.COLUMNS)
        new = folded((count, mean, second), rows >= 0, stats, self.decay, self.n0, self.v_prior)
        self.table.commit(keys, np.stack(new), rows)

    def warm_start(self, keys: Sequence[str], scores: Sequence[np.ndarray], n0_prior: float) -> None:
        """Start prompts from prior scores (history_spec 4): N_p = min(N, n0_prior), m1_p and m2_p their mean and
        mean square."""
        values = np.array([[min(len(s), n0_prior), float(np.mean(s)), float(np.mean(np.square(s)))] for s in scores])
        self.table.commit(list(keys), values.T.reshape(3, -1))

    def state_dict(self) -> dict[str, Any]:
        return self.table.state_dict()

    def validated(self, state: Mapping[str, Any]) -> tuple[list[str], np.ndarray]:
        keys, values = self.table.validated(state)
        if (values[0] < 0).any():
            raise ValueError("BV-Blend prompt state holds negative sample sizes; the file is corrupt.")
        return keys, values
