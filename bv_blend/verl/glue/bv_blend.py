"""``algorithm.adv_estimator=bv_blend``: the function verl calls, its options, and the process's estimator.

The math is :class:`bv_blend.BVBlendEstimator`. This module reads ``algorithm.bv_blend`` (the estimator's parameters
plus the glue's own keys: K, the codebook, how clusters are found), holds the process's estimator with its codebook,
and gives the checkpoint hooks its state (``global_step_N/bv_blend_state.pt``: the moments, K, the codebook hash, the
prior file's hash).

A prior file acts wherever the estimator is built, as SPO's offline values do: the prompt levels start from it in
:meth:`BVBlendOptions.build`. The cluster levels pool its prompts by their clusters, which only the training prompts
tell: verl's trainer start reads them from ``data.train_files`` (:meth:`BVBlendOptions.prepare`), the offline face takes
them in ``bv_blend.verl.offline.start_run``; a call before either is refused, never run without the priors.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bv_blend.blend import BVBlendConfig, BVBlendEstimator
from bv_blend.codebook import CLUSTER_KEY
from bv_blend.core.options import check_choice, check_optional_text, require
from bv_blend.history.priors import load_priors, priors_hash, unmatched
from bv_blend.verl import channel, runtime
from bv_blend.verl.clusters import ANNOTATE_HINT, build_cluster_map, cluster_ids_for_rows
from bv_blend.verl.options import ROW_FIELDS, TEXT_FIELDS, Columns, HistoryOptions
from bv_blend.verl.prompt_keys import prompt_keys_for_rows
from bv_blend.verl.records import CLUSTER_IDS, PROMPT_KEYS

logger = logging.getLogger(__name__)

NAME = "bv_blend"
SECTION = f"algorithm.{NAME}"
ON_MISSING_CLUSTER = ("error", "assign")
PRIORS_HASH = "prior_file_hash"  # in the state file: absent in states written before the resume check

@dataclass(frozen=True)
class BVBlendOptions(HistoryOptions):
    """``algorithm.bv_blend`` read and validated: the estimator's parameters and the glue's own keys.

    Attributes:
        config: the estimator's parameters.
        prompt_key_field: at the prompt levels, key each prompt by ``extra_info[field]`` instead of a hash of its text.
        allow_state_reset: on resume, start the history afresh instead of failing when the checkpoint has no
            BV-Blend state or a state made with another K / codebook / estimator config.
        num_clusters: K. ``None`` reads it from the codebook.
        codebook_path: codebook written by ``bv-blend codebook``; needed for ``assign`` and for the
            codebook check on resume.
        cluster_key: the ``extra_info`` key holding each prompt's integer cluster id.
        on_missing_cluster: ``error`` (a prompt without an id stops the run) or ``assign`` (encode it).
        prior_file: offline prior scores (``bv-blend priors``, history_spec 4): the history starts warm.
    """

    NAME = NAME
    CONFIG = BVBlendConfig

    config: BVBlendConfig = field(default_factory=BVBlendConfig)
    num_clusters: int | None = None
    codebook_path: str | None = None
    cluster_key: str = CLUSTER_KEY
    on_missing_cluster: str = "error"
    prior_file: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        k = self.num_clusters
        ok = k is None or (not isinstance(k, bool) and isinstance(k, int) and k >= 1)
        require(ok, SECTION, "num_clusters", k, "must be a positive int (K)")
        check_optional_text(SECTION, "codebook_path", self.codebook_path)
        require(isinstance(self.cluster_key, str) and bool(self.cluster_key), SECTION, "cluster_key",
                self.cluster_key, "must be a non-empty string")  # fmt: skip
        check_choice(SECTION, "on_missing_cluster", self.on_missing_cluster, ON_MISSING_CLUSTER)
        if self.on_missing_cluster == "assign" and self.codebook_path is None:
            raise ValueError(
                f"{SECTION}.on_missing_cluster=assign needs {SECTION}.codebook_path: prompts are assigned to the "
                "nearest centroid of that codebook, with the encoder it was built with."
            )
        check_optional_text(SECTION, "prior_file", self.prior_file)

    def inputs(self) -> frozenset[str]:
        return frozenset(
            [CLUSTER_IDS] * self.config.uses_clusters + [PROMPT_KEYS] * self.config.uses_prompts
        )  # the prompt level needs no codebook

    def fields_needed(self) -> tuple[str, ...]:
        text = self.on_missing_cluster == "assign" or self.config.uses_prompts  # the encoder reads the prompt
        return (*ROW_FIELDS, *(TEXT_FIELDS if text else ()))

    def step_inputs(self, built: BVBlendProcess, columns: Columns) -> dict[str, Any]:
        """uid -> cluster id (read from extra_info, or assigned by the codebook's encoder) and uid -> prompt key."""
        clusters = {}
        if self.config.uses_clusters:
            assign = built.assign_rows if self.on_missing_cluster == "assign" else None
            clusters["cluster_map"] = build_cluster_map(columns, self.cluster_key, built.num_clusters, assign)
        return {**clusters, **super().step_inputs(built, columns)}

    def build(self) -> BVBlendProcess:
        num_clusters, codebook = self._clusters() if self.config.uses_clusters else (self.num_clusters, None)
        process = BVBlendProcess(
            options=self,
            num_clusters=num_clusters,
            codebook_hash=None if codebook is None else codebook.content_hash,
            estimator=BVBlendEstimator(num_clusters, self.config),
            codebook=codebook,
        )
        priors = process.priors()  # a malformed prior file fails here, at trainer start
        if priors:
            process.estimator.warm_start(priors)  # the prompt levels need nothing else
            process.clusters_pending = self.config.uses_clusters
        return process

    def _clusters(self) -> tuple[int, Any]:
        """K and the loaded codebook (``None`` without ``codebook_path``); K given twice must agree."""
        if self.codebook_path is None:
            if self.num_clusters is None:
                raise ValueError(
                    f"algorithm.adv_estimator=bv_blend needs the number of clusters K: set {SECTION}.codebook_path="
                    "<codebook.npz from `bv-blend codebook`> (K is read from it) or "
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

    def advantages(
        self, built: BVBlendProcess, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
        step: channel.StepChannel,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Each row's cluster and prompt key, from the channel by uid, where the history level reads them."""
        if built.clusters_pending:
            raise ValueError(
                f"{SECTION}.prior_file={self.prior_file} at history_level={self.config.history_level} starts each "
                "cluster from the pooled priors of its training prompts, and their clusters are not known yet: verl's "
                "trainer reads them from data.train_files at its start; outside it, call "
                "bv_blend.verl.offline.start_run(algorithm, {prompt key: cluster id}) before the first step, or use "
                f"{SECTION}.history_level=prompt (no clusters)."
            )
        inputs = self.inputs()
        clusters = cluster_ids_for_rows(index, response_mask, step.cluster_map) if CLUSTER_IDS in inputs else None
        keys = prompt_keys_for_rows(index, response_mask, step.prompt_keys, NAME) if PROMPT_KEYS in inputs else None
        sources = step.sources_for(response_mask.shape[0])
        return built.estimator.compute_token_level(
            token_level_rewards, response_mask, index, clusters, source_rows=sources, prompt_keys=keys
        )

    def metrics(self, built: BVBlendProcess) -> Mapping[str, float]:
        return built.estimator.metrics

    def group_details(self, built: BVBlendProcess) -> Mapping[str, Mapping[str, float]]:
        return super().group_details(built.estimator)

    def prepare(self, built: BVBlendProcess, config: Any) -> None:
        """At trainer start: :meth:`start` with the training files' prompts and their clusters."""
        if self.prior_file is None:
            return
        from bv_blend.verl.training_data import training_prompts

        cluster_key = self.cluster_key if self.config.uses_clusters else None
        self.start(built, training_prompts(config, self.prompt_key_field, cluster_key))

    def start(self, built: BVBlendProcess, prompts: Mapping[str, int | None]) -> None:
        """Start the history from the prior file, pooling its prompts by their clusters among the training prompts
        ``prompts`` (key -> cluster id, history_spec 4); the file's prompts that no training row has are counted and
        reported."""
        if self.prior_file is None:
            return
        priors = built.priors()
        built.estimator.warm_start(priors, {key: c for key, c in prompts.items() if c is not None})
        built.clusters_pending = False
        if missing := unmatched(priors, prompts):
            logger.warning("%s: %d of its %d prompts are in no training file (their priors are unused at the "
                           "cluster level).", self.prior_file, missing, len(priors))  # fmt: skip

    def save(self, built: BVBlendProcess) -> dict[str, Any]:
        return {
            "num_clusters": built.num_clusters,
            "codebook_hash": built.codebook_hash,
            PRIORS_HASH: built.priors_hash(),
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
        self._check_priors(built, payload, path)
        super().restore(built.estimator, payload, path)
        built.clusters_pending = False  # the saved moments hold the priors the run started from

    def _check_priors(self, built: BVBlendProcess, payload: Mapping[str, Any], path: str) -> None:
        """The saved history started from the priors this run names, or the resume is refused (as SPO's).

        A state without the hash was written before this check: its history holds whatever priors its run started
        from, which nothing can tell now, so the resume goes on with a warning rather than throwing a run's history
        away (docs/priors.md)."""
        current = built.priors_hash()
        if PRIORS_HASH not in payload:
            if current is not None:
                logger.warning("%s predates the prior file check: it cannot say which priors its history started "
                               "from; it is resumed as it is, and %s.prior_file=%s is not applied.", path, SECTION,
                               self.prior_file)  # fmt: skip
            return
        if payload[PRIORS_HASH] != current:
            saved = "no prior file" if payload[PRIORS_HASH] is None else f"a prior file of hash {payload[PRIORS_HASH]}"
            now = "none" if current is None else f"{self.prior_file}, hash {current}"
            raise ValueError(
                f"{path} was written by a run that started from {saved}, but this run's {SECTION}.prior_file is "
                f"{now}: the resumed history would keep the old priors and silently ignore this run's. Resume with "
                f"the original {SECTION}.prior_file."
            )


@dataclass
class BVBlendProcess:
    """The BV-Blend estimator of this process, and what it was built from."""

    options: BVBlendOptions
    num_clusters: int | None
    codebook_hash: str | None
    estimator: BVBlendEstimator
    codebook: Any = None
    _assigner: Any = field(default=None, repr=False)
    # a prior file at a cluster level whose training prompts' clusters are not known yet (``BVBlendOptions.start``)
    clusters_pending: bool = False
    _priors: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def num_updates(self) -> int:
        return self.estimator.num_updates

    def priors(self) -> dict[str, np.ndarray]:
        """The prior file's scores (read once), or none."""
        if self._priors is None:
            path = self.options.prior_file
            self._priors = load_priors(path, f"{SECTION}.prior_file") if path is not None else {}
        return self._priors

    def priors_hash(self) -> str | None:
        """The prior file's content hash (saved with the state; a resume must match it), ``None`` without one."""
        priors = self.priors()
        return priors_hash(priors) if priors else None

    def assigner(self) -> Any:
        """The on-the-fly :class:`~bv_blend.codebook.encode.ClusterAssigner` (loads the encoder on first use)."""
        if self._assigner is None:
            from bv_blend.codebook.encode import ClusterAssigner  # heavy (sentence-transformers): only in assign mode

            self._assigner = ClusterAssigner(self.codebook)
        return self._assigner

    def success_estimates(
        self, keys: np.ndarray, cluster_ids: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(p^, known) for the prompt sampler (history_spec 5): the estimator's (the prompt's mean, else its
        cluster's), else the prior file's mean, else 0.5; ``known`` where the history gave it."""
        p_hat, known = self.estimator.success_estimates(keys, cluster_ids)
        if self.options.prior_file is not None and not known.all():
            priors = self.priors()
            prior_mean = np.array([float(priors[key].mean()) if key in priors else np.nan for key in keys])
            p_hat = np.where(~known & ~np.isnan(prior_mean), prior_mean, p_hat)
        return p_hat, known

    def assign_rows(self, rows: list[Mapping[str, Any]]) -> Any:
        """Cluster ids for dataset-like rows without one, by the codebook's encoder (loaded on first use)."""
        return self.assigner().assign_rows(rows)


compute_bv_blend_advantage = runtime.advantage_function(
    NAME, __name__, "BV-Blend outcome advantages: the prompt's GRPO baseline blended with its cluster's EMA history."
)


__all__ = ["BVBlendOptions", "BVBlendProcess", "compute_bv_blend_advantage"]
