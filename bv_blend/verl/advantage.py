"""The function verl calls for ``algorithm.adv_estimator=bv_blend``, shaped like its neighbours in core_algos.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bv_blend.inputs import nonempty_rows
from bv_blend.verl import runtime
from bv_blend.verl.clusters import cluster_ids_for_rows
from bv_blend.verl.multi_output import current_output_sources


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
        index: (bs,) prompt uids; each uid's cluster comes from the map the bv_blend trainer hooks publish.
        config: verl's ``config.algorithm``; options are read from its ``bv_blend`` sub-node.

    Returns:
        advantages and returns, both (bs, response_length) (equal, as for GRPO).
    """
    session = runtime.session_for(config)
    cluster_ids = cluster_ids_for_rows(index, response_mask, runtime.current_cluster_map())
    sources = current_output_sources()
    if sources is None or len(sources) != len(index):
        advantages, returns = session.estimator.compute_token_level(
            token_level_rewards, response_mask, index, cluster_ids
        )
    else:  # multi-output sessions: only final outputs count; the others take their final output's advantage
        valid = nonempty_rows(response_mask) & (sources == np.arange(len(sources)))
        sequence = session.estimator.compute(token_level_rewards.sum(-1), index, cluster_ids, valid=valid)
        advantages = returns = sequence[torch.from_numpy(sources)].unsqueeze(-1) * response_mask
    runtime.record_metrics(session.estimator.metrics)
    return advantages, returns
