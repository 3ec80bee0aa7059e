"""``algorithm.adv_estimator=bv_blend``: the function verl calls, its options, and the process's estimator.

The math is :class:`bv_blend.BVBlendEstimator`. This module reads ``algorithm.bv_blend`` (the estimator's parameters
plus the glue's own keys: K, the codebook, how clusters are found), holds the process's estimator with its codebook,
and gives the checkpoint hooks its state (``global_step_N/bv_blend_state.pt``: the moments, K, the codebook hash).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bv_blend.blend import BVBlendConfig, BVBlendEstimator
from bv_blend.codebook import CLUSTER_KEY
from bv_blend.verl import channel, runtime
from bv_blend.verl.clusters import ANNOTATE_HINT, cluster_ids_for_rows
from bv_blend.verl.options import GlueOptions, section_options

NAME = "bv_blend"
SECTION = f"algorithm.{NAME}"
ON_MISSING_CLUSTER = ("error", "assign")

@dataclass(frozen=True)
class BVBlendOptions(GlueOptions):
    """``algorithm.bv_blend`` read and validated: the estimator's parameters and the glue's own keys.

    Attributes:
        config: the estimator's parameters.
        num_clusters: K. ``None`` reads it from the codebook.
        codebook_path: codebook written by ``scripts/build_codebook.py``; needed for ``assign`` and for the
            codebook check on resume.
        cluster_key: the ``extra_info`` key holding each prompt's integer cluster id.
        on_missing_cluster: ``error`` (a prompt without an id stops the run) or ``assign`` (encode it).
        allow_state_reset: on resume, start the history afresh instead of failing when the checkpoint has no
            BV-Blend state or a state made with another K / codebook / estimator config.
    """

    NAME = NAME

    config: BVBlendConfig = field(default_factory=BVBlendConfig)
    num_clusters: int | None = None
    codebook_path: str | None = None
    cluster_key: str = CLUSTER_KEY
    on_missing_cluster: str = "error"
    allow_state_reset: bool = False

    def __post_init__(self) -> None:
        k = self.num_clusters
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"{SECTION}.num_clusters={k!r} is invalid: it must be a positive int (K).")
        if self.codebook_path is not None and not isinstance(self.codebook_path, str):
            raise ValueError(f"{SECTION}.codebook_path={self.codebook_path!r} must be a path string.")
        if not isinstance(self.cluster_key, str) or not self.cluster_key:
            raise ValueError(f"{SECTION}.cluster_key={self.cluster_key!r} must be a non-empty string.")
        if self.on_missing_cluster not in ON_MISSING_CLUSTER:
            raise ValueError(
                f"{SECTION}.on_missing_cluster={self.on_missing_cluster!r} is invalid: use one of "
                f"{', '.join(ON_MISSING_CLUSTER)}."
            )
        if self.on_missing_cluster == "assign" and self.codebook_path is None:
            raise ValueError(
                f"{SECTION}.on_missing_cluster=assign needs {SECTION}.codebook_path: prompts are assigned to the "
                "nearest centroid of that codebook, with the encoder it was built with."
            )
        if not isinstance(self.allow_state_reset, bool):
            raise ValueError(f"{SECTION}.allow_state_reset={self.allow_state_reset!r} must be a bool.")

    @classmethod
    def glue_keys(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls)) - {"config"}

    @classmethod
    def from_algorithm(cls, algorithm: Any) -> BVBlendOptions:
        options = section_options(algorithm, NAME)
        estimator_keys = frozenset(f.name for f in dataclasses.fields(BVBlendConfig))
        unknown = sorted(set(options) - cls.glue_keys() - estimator_keys)
        if unknown:
            raise ValueError(
                f"Unknown option(s) {SECTION}.{{{', '.join(unknown)}}}. Estimator options: {sorted(estimator_keys)}; "
                f"verl glue options: {sorted(cls.glue_keys())}. Check the spelling."
            )
        glue = {key: options.pop(key) for key in list(options) if key in cls.glue_keys()}
        return cls(config=BVBlendConfig.from_mapping(options), **glue)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        glue = cls()
        return {**glue.config.to_dict(), **{key: getattr(glue, key) for key in cls.glue_keys()}}

    def build(self) -> BVBlendProcess:
        num_clusters, codebook = self._clusters()
        return BVBlendProcess(
            options=self,
            num_clusters=num_clusters,
            codebook_hash=None if codebook is None else codebook.content_hash,
            estimator=BVBlendEstimator(num_clusters, self.config),
            codebook=codebook,
        )

    def _clusters(self) -> tuple[int, Any]:
        """K and the loaded codebook (``None`` without ``codebook_path``); K given twice must agree."""
        if self.codebook_path is None:
            if self.num_clusters is None:
                raise ValueError(
                    f"algorithm.adv_estimator=bv_blend needs the number of clusters K: set {SECTION}.codebook_path="
                    "<codebook.npz from scripts/build_codebook.py> (K is read from it) or "
                    f"{SECTION}.num_clusters=K. " + ANNOTATE_HINT
                )
            return self.num_clusters, None
        from bv_blend.codebook import Codebook

        codebook = Codebook.load(self.codebook_path)
        if self.num_clusters is not None and self.num_clusters != codebook.num_clusters:
            raise ValueError(
                f"{SECTION}.num_clusters={self.num_clusters} but the codebook {self.codebook_path} has "
                f"K={codebook.num_clusters}: drop num_clusters (it is read from the codebook) or use the matching "
                "codebook."
            )
        return codebook.num_clusters, codebook

    def save(self, built: BVBlendProcess) -> dict[str, Any]:
        return {
            "num_clusters": built.num_clusters,
            "codebook_hash": built.codebook_hash,
            "estimator": built.estimator.state_dict(),
        }

    def restore(self, built: BVBlendProcess, payload: Mapping[str, Any], path: str) -> None:
        if payload.get("num_clusters") != built.num_clusters:
            raise ValueError(
                f"{path} holds a BV-Blend state with K={payload.get('num_clusters')} clusters, but this run has "
                f"K={built.num_clusters}. Resume with the run's original codebook / {SECTION}.num_clusters."
            )
        if payload.get("codebook_hash") != built.codebook_hash:
            raise ValueError(
                f"{path} was written with codebook hash {payload.get('codebook_hash')}, but this run's codebook "
                f"({self.codebook_path}) has hash {built.codebook_hash}: cluster ids would mean other "
                f"clusters. Resume with the original {SECTION}.codebook_path."
            )
        super().restore(built.estimator, payload, path)


@dataclass
class BVBlendProcess:
    """The BV-Blend estimator of this process, and what it was built from."""

    options: BVBlendOptions
    num_clusters: int
    codebook_hash: str | None
    estimator: BVBlendEstimator
    codebook: Any = None
    _assigner: Any = field(default=None, repr=False)

    @property
    def num_updates(self) -> int:
        return self.estimator.num_updates

    def assigner(self) -> Any:
        """The on-the-fly :class:`~bv_blend.codebook.encode.ClusterAssigner` (loads the encoder on first use)."""
        if self._assigner is None:
            from bv_blend.codebook.encode import ClusterAssigner  # heavy (sentence-transformers): only in assign mode

            self._assigner = ClusterAssigner(self.codebook)
        return self._assigner


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
        index: (bs,) prompt uids; each uid's cluster comes from the step's channel that the trainer hooks open.
        config: verl's ``config.algorithm``; options are read from its ``bv_blend`` sub-node.

    Returns:
        advantages and returns, both (bs, response_length) (equal, as for GRPO).
    """
    estimator = runtime.estimator_for(NAME, config).estimator
    step = channel.current_step() or channel.StepChannel()
    cluster_ids = cluster_ids_for_rows(index, response_mask, step.cluster_map)
    advantages, returns = estimator.compute_token_level(
        token_level_rewards, response_mask, index, cluster_ids, source_rows=step.sources_for(len(cluster_ids))
    )
    channel.report_metrics(estimator.metrics)
    return advantages, returns


__all__ = ["BVBlendOptions", "BVBlendProcess", "compute_bv_blend_advantage"]
