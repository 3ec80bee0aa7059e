"""Process-wide state of our estimators in one verl trainer process.

verl computes advantages once per (mini-)batch, in the single-controller process (``TaskRunnerV1`` or the legacy
``TaskRunner``), and calls the registered estimator with tensors, uids and ``config.algorithm`` only. What a call
needs beyond that lives here:

- the :class:`ProcessEstimator`: the estimator (built lazily from ``algorithm.bv_blend``), K and the codebook;
- the companion estimators (``ha_dw``, ``maxnorm_ac``), one per name, built lazily from their options
  (:func:`process_object`);
- the metrics of the last call, collected by the hooks into verl's step dict;
- errors of hooks that could not be installed (reported at trainer start rather than lost in a log).

What one batch needs (its uid -> cluster map) is not process-wide: see ``bv_blend/verl/context.py``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bv_blend.blend.config import BVBlendConfig
from bv_blend.blend.estimator import BVBlendEstimator
from bv_blend.verl.context import forget_batch
from bv_blend.verl.options import ANNOTATE_HINT, GlueOptions, read_options

logger = logging.getLogger(__name__)


@dataclass
class ProcessEstimator:
    """The BV-Blend estimator of this process, and what it was built from."""

    estimator_config: BVBlendConfig
    glue: GlueOptions
    num_clusters: int
    codebook_hash: str | None
    estimator: BVBlendEstimator
    _codebook: Any = None
    _assigner: Any = field(default=None, repr=False)

    def assigner(self) -> Any:
        """The on-the-fly :class:`~bv_blend.codebook.encode.ClusterAssigner` (loads the encoder on first use)."""
        if self._assigner is None:
            from bv_blend.codebook.encode import ClusterAssigner  # heavy (sentence-transformers): only in assign mode

            self._assigner = ClusterAssigner(self._codebook)
        return self._assigner


_CURRENT: ProcessEstimator | None = None
_CURRENT_KEY: str | None = None
_COMPANIONS: dict[str, tuple[Any, Any]] = {}  # estimator name -> (the options it was built from, the object)
Built = TypeVar("Built")
_PENDING_METRICS: dict[str, float] = {}
HOOK_ERRORS: list[str] = []


def estimator_for(algorithm_config: Any) -> ProcessEstimator:
    """The process's estimator for these options, built on first use (validates options, loads the codebook).

    A process runs one training job, so the options never change in practice; if they do (tests, notebooks),
    a new estimator with a fresh history replaces the old one, with a warning.
    """
    global _CURRENT, _CURRENT_KEY
    estimator_config, glue = read_options(algorithm_config)
    key = json.dumps({"estimator": estimator_config.to_dict(), "glue": glue.__dict__}, sort_keys=True, default=str)
    if _CURRENT is not None and key == _CURRENT_KEY:
        return _CURRENT
    num_clusters, codebook = _resolve_clusters(glue)
    if _CURRENT is not None and _CURRENT.estimator.num_updates > 0:
        logger.warning("algorithm.bv_blend changed within one process: the BV-Blend history starts afresh.")
    _CURRENT = ProcessEstimator(
        estimator_config=estimator_config,
        glue=glue,
        num_clusters=num_clusters,
        codebook_hash=None if codebook is None else codebook.content_hash,
        estimator=BVBlendEstimator(num_clusters, estimator_config),
        _codebook=codebook,
    )
    _CURRENT_KEY = key
    return _CURRENT


def process_object(name: str, options: Any, build: Callable[[], Built]) -> Built:
    """The process's object for estimator ``name`` (e.g. its ``HADWEstimator``), built by ``build`` on first use.

    ``options`` (any value with ``==``) is what it was built from; when it changes (tests, notebooks), a new object
    replaces the old one, and the history of a stateful one starts afresh, with a warning.
    """
    held = _COMPANIONS.get(name)
    if held is not None and held[0] == options:
        return held[1]
    if held is not None and getattr(held[1], "num_updates", 0) > 0:
        logger.warning("algorithm.%s changed within one process: its history starts afresh.", name)
    built = build()
    _COMPANIONS[name] = (options, built)
    return built


def reset() -> None:
    """Forget every estimator, the pending metrics and any published batch context (for tests)."""
    global _CURRENT, _CURRENT_KEY
    _CURRENT, _CURRENT_KEY = None, None
    _COMPANIONS.clear()
    _PENDING_METRICS.clear()
    forget_batch()


def _resolve_clusters(glue: GlueOptions) -> tuple[int, Any]:
    """K and the loaded codebook (``None`` without ``codebook_path``); K given twice must agree."""
    if glue.codebook_path is None:
        if glue.num_clusters is None:
            raise ValueError(
                "algorithm.adv_estimator=bv_blend needs the number of clusters K: set "
                "algorithm.bv_blend.codebook_path=<codebook.npz from scripts/build_codebook.py> (K is read from it) "
                "or algorithm.bv_blend.num_clusters=K. " + ANNOTATE_HINT
            )
        return glue.num_clusters, None
    from bv_blend.codebook import Codebook

    codebook = Codebook.load(glue.codebook_path)
    if glue.num_clusters is not None and glue.num_clusters != codebook.num_clusters:
        raise ValueError(
            f"algorithm.bv_blend.num_clusters={glue.num_clusters} but the codebook {glue.codebook_path} has "
            f"K={codebook.num_clusters}: drop num_clusters (it is read from the codebook) or use the matching codebook."
        )
    return codebook.num_clusters, codebook


def record_metrics(metrics: Mapping[str, float]) -> None:
    """Keep the metrics of the last estimator call until a hook moves them into verl's step dict."""
    _PENDING_METRICS.clear()
    _PENDING_METRICS.update(metrics)


def pop_metrics() -> dict[str, float]:
    """The metrics of the last call, once (empty when no call of our estimators happened since the last pop)."""
    metrics = dict(_PENDING_METRICS)
    _PENDING_METRICS.clear()
    return metrics


def report_hook_error(message: str) -> None:
    """A hook could not be installed: log it loudly; the trainer-start check raises it if one of ours is used."""
    HOOK_ERRORS.append(message)
    logger.error(message)


def raise_hook_errors() -> None:
    if HOOK_ERRORS:
        raise RuntimeError(
            "bv_blend could not hook into this verl version, so its estimators and losses cannot run:\n- "
            + "\n- ".join(HOOK_ERRORS)
        )
