"""The group record: one JSON line per prompt group per training step, for every estimator (verl's own included).

Turned on by ``+bv_blend.group_record=<file.jsonl>`` (V1 trainer). Each line holds the step, the prompt's key
(history_spec 1) and cluster (``extra_info``'s, where the data carries one), its rollouts' verifier scores and
advantages (each row's mean over its response tokens), and what an estimator with a history took from it for that
group (BV-Blend: the history's mean and confidence weight, before the step's update). It is small enough to keep
with a run's results (20 steps of 64 rollouts: about 100-200 KB), and it is what lets a reader re-read a run's
mechanism afterwards: how far the history lags the pass rate, how much of the update falls on all-equal groups.

The line is appended after verl has written the step's advantages, so a crash between steps loses nothing already
written; a resumed run appends its steps after the ones already there (a step may then appear twice: the later line
is the one the resumed run used).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bv_blend.codebook import CLUSTER_KEY
from bv_blend.core.rows import is_padding_uid
from bv_blend.verl.options import config_get

OPTION = "bv_blend.group_record"
# The per-row fields the record reads from TransferQueue once verl has written the step's advantages.
FIELDS = ("uid", "extra_info", "raw_prompt", "rm_scores", "advantages")
DIGITS = 4  # advantages and history figures are kept to 4 decimals: the record stays small and still re-computable


def record_path(config: Any) -> Path | None:
    """The file ``bv_blend.group_record`` names, or ``None`` when the record is off."""
    value = config_get(config_get(config, "bv_blend"), "group_record")
    if value is None or value == "":
        return None
    if not isinstance(value, (str, Path)):
        raise ValueError(f"{OPTION} must be a file path (the group record's JSONL), got {value!r}: set "
                         f"+{OPTION}=/path/to/groups.jsonl, or leave it out to turn the record off.")
    return Path(value)


def check_run(config: Any, legacy: bool) -> None:
    """At trainer start: the record is written by the V1 trainer's advantage step; the legacy trainer has none."""
    if legacy and record_path(config) is not None:
        raise ValueError(f"{OPTION} is written by the V1 trainer's advantage step (trainer.use_v1=true, verl's "
                         f"default); this run uses the legacy trainer. Drop {OPTION} or drop trainer.use_v1=false.")


def group_lines(step: int, columns: Mapping[str, Sequence[Any] | None], prompt_keys: Mapping[str, str],
                details: Mapping[str, Mapping[str, float]], cluster_key: str = CLUSTER_KEY) -> list[dict[str, Any]]:
    """One record per prompt group of a step's rows, in order of first appearance; padding rows are left out.

    Args:
        step: verl's global step.
        columns: the step's per-row fields: ``uid``, ``extra_info``, ``rm_scores`` and ``advantages`` (each row's
            token-level tensor or list), as TransferQueue returns them.
        prompt_keys: uid -> prompt key.
        details: uid -> what the estimator took from its history for that group (empty for verl's estimators).
        cluster_key: the ``extra_info`` key of each prompt's cluster id.
    """
    uids = [str(uid) for uid in columns["uid"]]
    infos = columns.get("extra_info") or [None] * len(uids)
    padding = is_padding_uid(uids).tolist()
    groups: dict[str, dict[str, Any]] = {}
    for row, uid in enumerate(uids):
        if padding[row]:
            continue
        group = groups.get(uid)
        if group is None:
            info = infos[row] if isinstance(infos[row], Mapping) else {}
            cluster = info.get(cluster_key)
            group = groups[uid] = {"step": int(step), "prompt_key": prompt_keys.get(uid),
                                   "cluster": None if cluster is None else int(cluster), "rewards": [],
                                   "advantages": [], **_rounded(details.get(uid, {}))}
        group["rewards"].append(_rounded_number(float(_token_values(columns["rm_scores"][row]).sum())))
        group["advantages"].append(_rounded_number(float(_token_values(columns["advantages"][row]).mean())))
    return list(groups.values())


def append(path: Path, lines: Sequence[Mapping[str, Any]]) -> None:
    """Appends the lines as strict JSON (no NaN or Infinity: a figure that is not finite is written as null)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        for line in lines:
            out.write(json.dumps(line, allow_nan=False) + "\n")


def _token_values(values: Any) -> Any:
    """A row's token values as a float tensor or array (TransferQueue gives tensors; tests may give lists)."""
    import numpy as np
    import torch

    if isinstance(values, torch.Tensor):
        return values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=float)


def _rounded_number(value: float) -> float | None:
    return round(value, DIGITS) if math.isfinite(value) else None


def _rounded(details: Mapping[str, float]) -> dict[str, float | None]:
    return {name: _rounded_number(float(value)) for name, value in details.items()}


__all__ = ["FIELDS", "OPTION", "append", "check_run", "group_lines", "record_path"]
