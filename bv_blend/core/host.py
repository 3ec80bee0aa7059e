"""Host arrays for the estimator's arithmetic, and the two truth tests its hot path uses.

The estimator's interface is torch and its arithmetic float64 numpy on the host. In a trainer the estimator runs
once a step, so its code is cold, and what a call costs depends on how many distinct numpy and torch entry
points it goes through. The helpers below take the cheap ones; docs/estimator.md ("Speed") gives the
measurements (``scripts/bench_ops.py``, ``scripts/bench_estimator.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def host_array(values: torch.Tensor | np.ndarray | Any) -> np.ndarray:
    """A CPU numpy array of ``values``, without a copy when they already are one (or a CPU tensor)."""
    if not isinstance(values, torch.Tensor):
        return np.asarray(values)
    if values.requires_grad:
        values = values.detach()
    if not values.is_cpu:
        values = values.cpu()
    if values.dtype == torch.bfloat16:  # numpy has no bfloat16
        values = values.float()
    return values.numpy()


def any_true(mask: np.ndarray) -> bool:
    """``mask.any()``, through numpy's cheapest entry point."""
    return np.count_nonzero(mask) > 0


def all_true(mask: np.ndarray) -> bool:
    """``mask.all()``, through numpy's cheapest entry point."""
    return np.count_nonzero(mask) == np.size(mask)
