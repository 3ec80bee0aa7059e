"""What the trainer hooks know about the batch verl is about to hand the estimator, and verl's call does not carry.

verl calls a registered estimator with tensors, the uids (``index``) and ``config.algorithm`` only. The hooks
around verl's own advantage step publish the rest for the duration of that step:

    with batch_context(cluster_map={uid: cluster, ...}, output_sources=rows):
        verl_computes_the_advantages(...)        # -> compute_bv_blend_advantage reads current_batch()

It is a ``contextvars`` value, so a nested or concurrent step (threads, asyncio) sees its own batch only.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchContext:
    """Per-batch facts for the estimator.

    Attributes:
        cluster_map: prompt uid -> cluster id, for every non-padding uid of the batch.
        output_sources: for each row, the row of its session's final output (multi-output agent sessions,
            ``bv_blend.verl.multi_output``); ``None`` when every session has one output.
    """

    cluster_map: Mapping[str, int] | None = None
    output_sources: np.ndarray | None = None


_CURRENT: contextvars.ContextVar[BatchContext | None] = contextvars.ContextVar("bv_blend_batch", default=None)


@contextlib.contextmanager
def batch_context(
    cluster_map: Mapping[str, int] | None = None, output_sources: np.ndarray | None = None
) -> Iterator[BatchContext]:
    """Publish the facts of the batch verl is about to pass to the estimator, until the block exits."""
    context = BatchContext(cluster_map=cluster_map, output_sources=output_sources)
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        _CURRENT.reset(token)


def current_batch() -> BatchContext | None:
    """The context published by the innermost :func:`batch_context`, or ``None`` outside one."""
    return _CURRENT.get()


def forget_batch() -> None:
    """Drop any published context in this thread (for tests; :func:`bv_blend.verl.runtime.reset` calls it)."""
    _CURRENT.set(None)


__all__ = ["BatchContext", "batch_context", "current_batch", "forget_batch"]
