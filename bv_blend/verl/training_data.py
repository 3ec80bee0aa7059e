"""The training prompts of a run: each row's prompt key and cluster, read from ``data.train_files`` at trainer start,
or from the trainer's own training set (verl's dataset, after its filters) once it is built.

Offline priors are keyed by prompt; BV-Blend pools them by cluster (history_spec 4), and every estimator reports the
file's keys that no training row has. Only the prompt column and ``extra_info`` are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from bv_blend.history.keys import prompt_key
from bv_blend.verl.options import config_get


def training_prompts(config: Any, key_field: str | None, cluster_key: str | None = None) -> dict[str, int | None]:
    """Prompt key -> the prompt's cluster id (``extra_info[cluster_key]``; ``None`` without ``cluster_key``) for every
    row of the run's training files."""
    data = config_get(config, "data")
    files = config_get(data, "train_files")
    files = [files] if isinstance(files, str) else list(files or [])
    column = str(config_get(data, "prompt_key") or "prompt")
    prompts: dict[str, int | None] = {}
    for path in files:
        frame = pd.read_parquet(path, columns=[column, "extra_info"])
        for prompt, extra_info in zip(frame[column], frame["extra_info"], strict=True):
            key = prompt_key(prompt, extra_info, key_field)
            cluster = extra_info.get(cluster_key) if cluster_key and isinstance(extra_info, dict) else None
            prompts[key] = None if cluster is None else int(cluster)
    return prompts


def dataset_columns(dataset: Any) -> tuple[list[Any], list[Any]]:
    """Each row's prompt and ``extra_info`` of verl's training dataset (an ``RLHFDataset``: its ``dataframe``, no
    tokenizing), or of any map-style dataset whose items hold ``raw_prompt`` and ``extra_info``."""
    frame = getattr(dataset, "dataframe", None)
    column = getattr(dataset, "prompt_key", "prompt")
    if frame is not None and column in getattr(frame, "column_names", ()):
        infos = frame["extra_info"] if "extra_info" in frame.column_names else [None] * len(frame)
        return list(frame[column]), list(infos)
    items = [dataset[i] for i in range(len(dataset))]
    return [item.get("raw_prompt") for item in items], [item.get("extra_info") for item in items]


def dataset_prompt_keys(dataset: Any, key_field: str | None) -> Sequence[str]:
    """Every row's prompt key in verl's training ``dataset``, as the trainer hooks key its rows at each step."""
    prompts, infos = dataset_columns(dataset)
    return [prompt_key(prompt, info, key_field) for prompt, info in zip(prompts, infos, strict=True)]


__all__ = ["dataset_columns", "dataset_prompt_keys", "training_prompts"]
