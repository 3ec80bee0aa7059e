"""The ``algorithm.bv_blend.*`` options: estimator parameters plus the verl glue's own keys.

verl hands every advantage estimator the raw ``config.algorithm`` node (an OmegaConf ``DictConfig``, or ``None``
when ``compute_advantage`` is called directly). This module turns its ``bv_blend`` sub-node into a validated
:class:`~bv_blend.BVBlendConfig` and a :class:`GlueOptions`, with the defaults of ``configs/bv_blend.yaml`` for
every key that is absent (so ``+algorithm.bv_blend.x=...`` on verl's stock config works too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bv_blend.codebook import CLUSTER_KEY
from bv_blend.config import BVBlendConfig

ESTIMATOR_NAME = "bv_blend"
ON_MISSING_CLUSTER = ("error", "assign")
ANNOTATE_HINT = (
    "Annotate the training data offline: `python scripts/build_codebook.py train.parquet --num-clusters K "
    "--out-dir DIR` writes DIR/codebook.npz and copies of the parquet files whose extra_info carries "
    f"'{CLUSTER_KEY}'; train on those copies with algorithm.bv_blend.codebook_path=DIR/codebook.npz. "
    "Or set algorithm.bv_blend.on_missing_cluster=assign (with codebook_path) to assign missing prompts on the "
    "fly with the codebook's encoder."
)


@dataclass(frozen=True)
class GlueOptions:
    """Options of the verl glue (not of the estimator's math).

    Attributes:
        num_clusters: K. ``None`` reads it from the codebook.
        codebook_path: codebook written by ``scripts/build_codebook.py``; needed for ``assign`` and for the
            codebook check on resume.
        cluster_key: the ``extra_info`` key holding each prompt's integer cluster id.
        on_missing_cluster: ``error`` (a prompt without an id stops the run) or ``assign`` (encode it).
        allow_state_reset: on resume, start the history afresh instead of failing when the checkpoint has no
            BV-Blend state or a state made with another K / codebook / estimator config.
    """

    num_clusters: int | None = None
    codebook_path: str | None = None
    cluster_key: str = CLUSTER_KEY
    on_missing_cluster: str = "error"
    allow_state_reset: bool = False

    def __post_init__(self) -> None:
        k = self.num_clusters
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"algorithm.bv_blend.num_clusters={k!r} is invalid: it must be a positive int (K).")
        if self.codebook_path is not None and not isinstance(self.codebook_path, str):
            raise ValueError(f"algorithm.bv_blend.codebook_path={self.codebook_path!r} must be a path string.")
        if not isinstance(self.cluster_key, str) or not self.cluster_key:
            raise ValueError(f"algorithm.bv_blend.cluster_key={self.cluster_key!r} must be a non-empty string.")
        if self.on_missing_cluster not in ON_MISSING_CLUSTER:
            raise ValueError(
                f"algorithm.bv_blend.on_missing_cluster={self.on_missing_cluster!r} is invalid: use one of "
                f"{', '.join(ON_MISSING_CLUSTER)}."
            )
        if self.on_missing_cluster == "assign" and self.codebook_path is None:
            raise ValueError(
                "algorithm.bv_blend.on_missing_cluster=assign needs algorithm.bv_blend.codebook_path: prompts are "
                "assigned to the nearest centroid of that codebook, with the encoder it was built with."
            )
        if not isinstance(self.allow_state_reset, bool):
            raise ValueError(f"algorithm.bv_blend.allow_state_reset={self.allow_state_reset!r} must be a bool.")


GLUE_KEYS = frozenset(field.name for field in dataclasses.fields(GlueOptions))
ESTIMATOR_KEYS = frozenset(field.name for field in dataclasses.fields(BVBlendConfig))


def uses_bv_blend(config: Any) -> bool:
    """True when the full trainer config selects ``algorithm.adv_estimator=bv_blend``."""
    algorithm = _get(config, "algorithm")
    return algorithm is not None and str(_get(algorithm, "adv_estimator")) == ESTIMATOR_NAME


def read_options(algorithm_config: Any) -> tuple[BVBlendConfig, GlueOptions]:
    """Split and validate ``algorithm.bv_blend``; missing keys take the defaults of ``configs/bv_blend.yaml``.

    Raises:
        ValueError: an unknown key (named, with the known ones), or an invalid value.
    """
    node = _get(algorithm_config, ESTIMATOR_NAME) if algorithm_config is not None else None
    if isinstance(node, DictConfig):
        options = OmegaConf.to_container(node, resolve=True)
    elif node is None or isinstance(node, Mapping):
        options = dict(node or {})
    else:
        raise ValueError(f"algorithm.bv_blend must be a mapping of options, got {type(node).__name__}.")
    unknown = sorted(set(options) - GLUE_KEYS - ESTIMATOR_KEYS)
    if unknown:
        raise ValueError(
            f"Unknown option(s) algorithm.bv_blend.{{{', '.join(unknown)}}}. Estimator options: "
            f"{sorted(ESTIMATOR_KEYS)}; verl glue options: {sorted(GLUE_KEYS)}. Check the spelling."
        )
    glue = GlueOptions(**{k: options.pop(k) for k in list(options) if k in GLUE_KEYS})
    return BVBlendConfig.from_mapping(options), glue


def _get(node: Any, key: str) -> Any:
    """``node.get(key)`` for dicts and DictConfigs (struct mode included), ``getattr`` for namespaces."""
    if isinstance(node, (Mapping, DictConfig)):
        return node.get(key)
    return getattr(node, key, None)
