"""The function verl calls for ``algorithm.adv_estimator=bv_blend``, shaped like its neighbours in core_algos.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bv_blend.verl import runtime
from bv_blend.verl.clusters import cluster_ids_for_rows
from bv_blend.verl.context import BatchContext, current_batch


def compute_bv_blend_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BV-Blend outcome advantages: the prompt's GRPO baseline blended with its cluster's EMA history.

    Args:
        token_level_rewards: (bs, response_length) rewards; the sequence reward is their sum.
        response_mask: (bs, response_length); all-zero rows (verl's padding) get advantage 0 and no update.
        index: (bs,) prompt uids; each uid's cluster comes from the batch context the trainer hooks publish.
        config: verl's ``config.algorithm``; options are read from its ``bv_blend`` sub-node.

    Returns:
        advantages and returns, both (bs, response_length) (equal, as for GRPO).
    """
    estimator = runtime.estimator_for(config).estimator
    batch = current_batch() or BatchContext()
    cluster_ids = cluster_ids_for_rows(index, response_mask, batch.cluster_map)
    sources = batch.output_sources
    if sources is not None and len(sources) != len(index):
        sources = None  # published for another batch shape: every row is its own output
    advantages, returns = estimator.compute_token_level(
        token_level_rewards, response_mask, index, cluster_ids, source_rows=sources
    )
    runtime.record_metrics(estimator.metrics)
    return advantages, returns
