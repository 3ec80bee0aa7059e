"""Multi-output agent sessions in the V1 trainer: only a session's final output counts, as for verl's GRPO.

An agent loop may return several outputs per session; TransferQueue keys them ``{uid}_{session}_{i}`` and verl
copies the session's final reward to every output. verl's GRPO (``compute_advantage_for_multi_trajectories`` in
verl/trainer/ppo/v1/utils.py) computes advantages on the final output of each session only and broadcasts the
result to the session's other outputs, so that a session counts once whatever its number of turns. Our estimators
do the same: the V1 hook publishes :func:`final_output_rows` as the batch's ``output_sources``
(``bv_blend.verl.channel``), and every estimator's token-level face (``core.rows.token_level``, its
``source_rows``) leaves non-final outputs out of the group statistics and the history, then gives them their final
output's advantage.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def final_output_rows(keys: Sequence[str]) -> np.ndarray | None:
    """For each row, the row of its session's final output (the largest ``i``); None when every session has one
    output (the common single-turn case) or the keys do not follow verl's ``{uid}_{session}_{i}`` format."""
    if len(keys) == 0:
        return None
    parts = pd.Series(list(keys), dtype=object).str.rsplit("_", n=2, expand=True)
    if parts.shape[1] != 3 or parts.isna().any().any() or not parts[2].str.isdigit().all():
        return None
    session = parts[0] + "_" + parts[1]
    if not session.duplicated().any():
        return None
    output_index = parts[2].astype(np.int64)
    final_row = output_index.groupby(session, sort=False).idxmax()
    return session.map(final_row).to_numpy(dtype=np.int64, copy=True)

