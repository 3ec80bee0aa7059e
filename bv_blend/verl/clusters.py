"""uid -> cluster id for one batch, read from each row's ``extra_info`` (or assigned on the fly).

Both trainers give every row its prompt's ``uid`` (a fresh uuid per prompt and step) and carry the dataset's
``extra_info`` along: on the legacy ``DataProto`` (``non_tensor_batch``), in V1 in TransferQueue. Mapping by uid
is robust to verl reordering rows (``_balance_batch``) and to its synthetic padding rows (uid ``pad...``).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from bv_blend.blend.moments import NO_CLUSTER
from bv_blend.codebook import CLUSTER_KEY
from bv_blend.core.rows import is_padding_uid, per_row_from_uids

ANNOTATE_HINT = (
    "Annotate the training data offline: `bv-blend codebook train.parquet --num-clusters K "
    "--out-dir DIR` writes DIR/codebook.npz and copies of the parquet files whose extra_info carries "
    f"'{CLUSTER_KEY}'; train on those copies with algorithm.bv_blend.codebook_path=DIR/codebook.npz. "
    "Or set algorithm.bv_blend.on_missing_cluster=assign (with codebook_path) to assign missing prompts on the "
    "fly with the codebook's encoder."
)


class MissingClusterError(ValueError):
    """A prompt reached the estimator without a cluster id and ``on_missing_cluster`` is ``error``."""


def build_cluster_map(
    columns: Mapping[str, Sequence[Any] | None],
    key: str,
    num_clusters: int,
    assign: Callable[[list[dict[str, Any]]], Sequence[int]] | None = None,
) -> dict[str, int]:
    """uid -> cluster id for the non-padding rows of a batch.

    Args:
        columns: the batch's per-row fields: ``uid``, ``extra_info`` (``None`` when the batch has none at all) and,
            for ``assign``, the prompt's text (``prompt`` or ``raw_prompt``).
        key: the ``extra_info`` key that holds each prompt's id.
        num_clusters: K; an id must be in 0..K-1.
        assign: dataset-like rows -> their cluster ids, for the prompts without an id (``on_missing_cluster=assign``);
            ``None``: such a prompt is an error (``on_missing_cluster=error``).

    Raises:
        MissingClusterError: prompts without an id and no ``assign`` (the message says how to annotate).
        ValueError: an id that is not an integer in 0..K-1, or two rows of one uid with different ids.
    """
    uids, extra_infos = columns["uid"], columns.get("extra_info")
    clusters: dict[str, int] = {}
    missing: dict[str, int] = {}  # uid -> first row, for the error message or the encoder
    padding = is_padding_uid(uids).tolist()
    for row, uid in enumerate(uids):
        uid = str(uid)
        if padding[row]:
            continue
        info = extra_infos[row] if extra_infos is not None else None
        value = info.get(key) if isinstance(info, Mapping) else None
        if value is None:
            missing.setdefault(uid, row)
            continue
        cluster = _as_cluster_id(value, uid, key, num_clusters)
        if clusters.setdefault(uid, cluster) != cluster:
            raise ValueError(
                f"Rows of prompt uid {uid} carry different cluster ids ({clusters[uid]} and {cluster}) in "
                f"extra_info['{key}']: all rows of one prompt must share its id. Re-annotate the data."
            )
    missing = {uid: row for uid, row in missing.items() if uid not in clusters}
    if missing:
        clusters.update(_assign_missing(columns, key, missing, assign))
    return clusters


def cluster_ids_for_rows(
    index: Sequence[Any] | None, response_mask: torch.Tensor, mapping: Mapping[str, int] | None
) -> torch.Tensor:
    """Per-row cluster ids for the estimator: the uid's id, or -1 for padding rows (pad uid or empty mask)."""
    if index is None:
        raise ValueError(
            "BV-Blend needs each row's prompt uid (verl passes it as `index` from non_tensor_batch['uid']); "
            "the DataProto given to compute_advantage has no 'uid'."
        )
    ids, unknown = per_row_from_uids(index, response_mask, mapping, fill=NO_CLUSTER, dtype=np.int64)
    if unknown:
        raise MissingClusterError(
            f"BV-Blend has no cluster id for {len(set(unknown))} prompt uid(s) (e.g. {unknown[0]}). The bv_blend "
            "trainer hooks read each prompt's cluster from its extra_info before verl calls the estimator; "
            + (
                "they did not run for this call (is `bv_blend.verl.plugin` imported in this process? run "
                "`bv-blend doctor`). When calling verl's compute_advantage yourself, pass a DataProto "
                "whose non_tensor_batch has 'extra_info', or wrap the call in "
                "bv_blend.verl.channel.advantage_step(cluster_map=...)."
                if mapping is None
                else "these uids were not in the batch they read."
            )
        )
    return torch.from_numpy(ids)


def _as_cluster_id(value: Any, uid: str, key: str, k: int) -> int:
    integral = isinstance(value, numbers.Integral) or (isinstance(value, numbers.Real) and float(value).is_integer())
    if isinstance(value, bool) or not integral or not 0 <= int(value) < k:
        raise ValueError(
            f"extra_info['{key}']={value!r} of prompt uid {uid} is not a cluster id in 0..{k - 1} (K={k}). "
            "The data was annotated with another codebook, or the key holds something else; re-annotate with "
            "`bv-blend codebook`, or point algorithm.bv_blend.codebook_path / num_clusters at the matching K."
        )
    return int(value)


def _assign_missing(
    columns: Mapping[str, Sequence[Any] | None],
    key: str,
    missing: dict[str, int],
    assign: Callable[[list[dict[str, Any]]], Sequence[int]] | None,
) -> dict[str, int]:
    if assign is None:
        example = next(iter(missing))
        raise MissingClusterError(
            f"{len(missing)} prompt(s) in this batch have no cluster id in extra_info['{key}'] (e.g. uid {example}), "
            "and algorithm.bv_blend.on_missing_cluster=error. " + ANNOTATE_HINT
        )
    assigned = assign([_dataset_row(columns, row) for row in missing.values()])
    return {uid: int(cluster) for uid, cluster in zip(missing, assigned, strict=True)}


def _dataset_row(columns: Mapping[str, Sequence[Any] | None], row: int) -> dict[str, Any]:
    """Row ``row`` as a dataset-like dict for the encoder; ``raw_prompt`` stands in for a missing ``prompt``."""
    out = {name: values[row] for name, values in columns.items() if values is not None}
    if out.get("prompt") is None and out.get("raw_prompt") is not None:
        out["prompt"] = out["raw_prompt"]
    return out
