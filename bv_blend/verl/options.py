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

from bv_blend.blend.config import BVBlendConfig
from bv_blend.codebook import CLUSTER_KEY

ESTIMATOR_NAME = "bv_blend"
# Every advantage estimator this package registers; the trainer hooks act only when one of them is selected.
OUR_ESTIMATORS = (ESTIMATOR_NAME, "ha_dw", "maxnorm_ac")
NTF_LOSS = "ntf"
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
    return selected_estimator(config) == ESTIMATOR_NAME


def selected_estimator(config: Any) -> str | None:
    """The name of our estimator that the full trainer config selects (``bv_blend``, ``ha_dw``, ``maxnorm_ac``),
    or ``None`` for any other estimator."""
    algorithm = config_get(config, "algorithm")
    name = str(config_get(algorithm, "adv_estimator")) if algorithm is not None else None
    return name if name in OUR_ESTIMATORS else None


def uses_ntf(config: Any) -> bool:
    """True when the full trainer config selects ``actor_rollout_ref.actor.policy_loss.loss_mode=ntf``."""
    actor = config_get(config_get(config, "actor_rollout_ref"), "actor")
    return str(config_get(config_get(actor, "policy_loss"), "loss_mode")) == NTF_LOSS


def section_options(algorithm_config: Any, name: str) -> dict[str, Any]:
    """``algorithm.<name>`` as a plain dict (empty when absent); an error when it is not a mapping."""
    node = config_get(algorithm_config, name) if algorithm_config is not None else None
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    if node is None or isinstance(node, Mapping):
        return dict(node or {})
    raise ValueError(f"algorithm.{name} must be a mapping of options, got {type(node).__name__}.")


def read_options(algorithm_config: Any) -> tuple[BVBlendConfig, GlueOptions]:
    """Split and validate ``algorithm.bv_blend``; missing keys take the defaults of ``configs/bv_blend.yaml``.

    Raises:
        ValueError: an unknown key (named, with the known ones), or an invalid value.
    """
    options = section_options(algorithm_config, ESTIMATOR_NAME)
    unknown = sorted(set(options) - GLUE_KEYS - ESTIMATOR_KEYS)
    if unknown:
        raise ValueError(
            f"Unknown option(s) algorithm.bv_blend.{{{', '.join(unknown)}}}. Estimator options: "
            f"{sorted(ESTIMATOR_KEYS)}; verl glue options: {sorted(GLUE_KEYS)}. Check the spelling."
        )
    glue = GlueOptions(**{k: options.pop(k) for k in list(options) if k in GLUE_KEYS})
    return BVBlendConfig.from_mapping(options), glue


def config_get(node: Any, key: str) -> Any:
    """``node.get(key)`` for dicts and DictConfigs (struct mode included), ``getattr`` for namespaces."""
    if node is None:
        return None
    if isinstance(node, (Mapping, DictConfig)):
        return node.get(key)
    return getattr(node, key, None)
