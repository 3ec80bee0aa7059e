"""The history-driven prompt sampler in verl's trainers (history_spec 5): p^ per prompt from the process's estimator.

p^ of a prompt is the first of these that exists: (1) SPO's tracker, (2) BV-Blend's prompt mean m1_p, (3) the mean
m1_k of the prompt's cluster, (4) the prior file's mean, (5) 0.5.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bv_blend.verl import runtime
from bv_blend.verl.records import RECORDS, record_for, resolve


def success_estimates(algorithm: Any, keys: np.ndarray, cluster_ids: np.ndarray | None = None) -> np.ndarray:
    """(P,) p^ of each prompt key, from the history of the estimator ``algorithm`` selects (its record's
    ``success_estimates``); an estimator without one is refused."""
    record = record_for(algorithm.adv_estimator)
    if record is None or record.success_estimates is None:
        with_history = [r.name for r in RECORDS if r.success_estimates is not None]
        raise ValueError(
            f"The prompt sampler draws by each prompt's history, and adv_estimator={algorithm.adv_estimator} keeps "
            f"none. Select one that does ({', '.join(with_history)}), or turn the sampler off."
        )
    process = runtime.process_for(record.name, algorithm)
    p_hat = resolve(record.success_estimates)(process, np.asarray(keys, dtype=object), cluster_ids)
    return np.clip(p_hat, 0.0, 1.0)


__all__ = ["success_estimates"]
