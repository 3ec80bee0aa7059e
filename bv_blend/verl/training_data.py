"""The training prompts of a run, read from ``data.train_files`` at trainer start: each row's prompt key and cluster.

Offline priors are keyed by prompt; BV-Blend pools them by cluster (history_spec 4), and every estimator reports the
file's keys that no training row has. Only the prompt column and ``extra_info`` are read.
"""

from __future__ import annotations

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


__all__ = ["training_prompts"]
