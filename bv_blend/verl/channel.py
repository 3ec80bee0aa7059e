"""One advantage step's channel between the trainer hooks and the estimator, both ways.

verl calls a registered estimator with tensors, the uids (``index``) and ``config.algorithm`` only. The hooks around
verl's own advantage step open a channel for the duration of that step: in, what verl's call does not carry; out,
the metrics of the step (the estimator's, and those of the batch the prompt sampler drew), which the hook then
moves into verl's step metrics.

    with advantage_step(cluster_map={uid: cluster}, prompt_keys={uid: key}) as step:
        verl_computes_the_advantages(...)        # -> compute_bv_blend_advantage reads current_step()
    metrics.update(step.metrics)

It is a ``contextvars`` value, so a nested or concurrent step (threads, asyncio) sees its own channel only.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class StepChannel:
    """One advantage step's facts for the estimator, and what it reports back.

    Attributes:
        cluster_map: prompt uid -> cluster id, for every non-padding uid of the batch.
        prompt_keys: prompt uid -> the prompt's stable key (history_spec 1).
        output_sources: for each row, the row of its session's final output (multi-output agent sessions,
            ``bv_blend.verl.multi_output``); ``None`` when every session has one output.
        metrics: out: the metrics of this step: the estimator's call, and the prompt sampler's batch.
        group_details: out: prompt uid -> what the estimator took from its history for that group (the group
            record's, ``bv_blend.verl.group_record``); empty for an estimator without a history.
    """

    cluster_map: Mapping[str, int] | None = None
    prompt_keys: Mapping[str, str] | None = None
    output_sources: np.ndarray | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    group_details: dict[str, dict[str, float]] = field(default_factory=dict)

    def sources_for(self, rows: int) -> np.ndarray | None:
        """``output_sources`` when they were published for a batch of ``rows`` rows, else ``None``."""
        sources = self.output_sources
        return sources if sources is not None and len(sources) == rows else None


_CURRENT: contextvars.ContextVar[StepChannel | None] = contextvars.ContextVar("bv_blend_step", default=None)


@contextlib.contextmanager
def advantage_step(**inputs: Any) -> Iterator[StepChannel]:
    """Open the channel of the advantage step verl is about to run, until the block exits."""
    step = StepChannel(**inputs)
    token = _CURRENT.set(step)
    try:
        yield step
    finally:
        _CURRENT.reset(token)


def current_step() -> StepChannel | None:
    """The channel of the innermost :func:`advantage_step`, or ``None`` outside one."""
    return _CURRENT.get()


def report_metrics(metrics: Mapping[str, float]) -> None:
    """Metrics of this step (the estimator's, the prompt sampler's), for the hook to move into verl's; dropped outside
    a step. A later report of the same name replaces the earlier."""
    step = current_step()
    if step is not None:
        step.metrics.update(metrics)


def report_group_details(details: Mapping[str, Mapping[str, float]]) -> None:
    """Per-group figures of this step's estimator call (uid -> name -> value), for the group record; dropped outside
    a step."""
    step = current_step()
    if step is not None:
        step.group_details.update({uid: dict(figures) for uid, figures in details.items()})


def close_all() -> None:
    """Drop any open channel in this thread (for tests; ``bv_blend.verl.runtime.reset`` calls it)."""
    _CURRENT.set(None)


__all__ = ["StepChannel", "advantage_step", "close_all", "current_step", "report_group_details", "report_metrics"]
