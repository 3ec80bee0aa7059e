"""The estimators the lab compares: data (a verl estimator name and the options merged into ``config.algorithm``).

Every estimator runs through verl's own registered function, called as verl's trainer calls it
(``bv_blend.verl.offline.compute_advantages``): token-level rewards (B, 1) with the outcome reward on the response's
only token, an all-ones response mask, one uuid per prompt and step, and verl's default ``algorithm`` node with the
spec's options merged in. The one exception is the ``oracle``: the true advantage R - p, which no estimator can
know; it is a reference line, not a method.

An entry that this installation cannot run (an estimator that is not registered, or options that this version
rejects) is skipped with the reason, which the report prints. Whether an estimator keeps a history between calls (and
so needs a fresh one at the start of a run) comes from its record (``bv_blend/verl/records.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from bv_blend import BVBlendConfig
from bv_blend.verl import offline
from bv_blend.verl.records import record_for

ORACLE = "oracle"


@dataclass(frozen=True)
class EstimatorSpec:
    """One estimator: a name in verl's registry and the options merged into verl's ``config.algorithm``."""

    label: str = field(compare=False)  # two specs that differ only in their label run once
    adv_estimator: str = ""
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def algorithm_options(self, num_clusters: int) -> dict[str, Any]:
        """The options for one run; BV-Blend also gets K (``algorithm.bv_blend.num_clusters``)."""
        options = {key: dict(value) if isinstance(value, Mapping) else value for key, value in self.options.items()}
        if self.adv_estimator == "bv_blend":
            options["bv_blend"] = {**options.get("bv_blend", {}), "num_clusters": num_clusters}
        return options

    def with_bv_blend(self, label: str, **bv_options: Any) -> EstimatorSpec:
        """A BV-Blend variant with some ``algorithm.bv_blend`` options changed (for sweeps)."""
        return replace(self, label=label, options={"bv_blend": {**self.options.get("bv_blend", {}), **bv_options}})


def bv_blend(label: str, **options: Any) -> EstimatorSpec:
    return EstimatorSpec(label, "bv_blend", {"bv_blend": options})


# The estimator table. The stability options (variance_floor, max_abs_advantage="auto") are spec section 5 step 8;
# "literal" is the paper's formulas exactly (no floor, no clip).
LITERAL = {"variance_floor": "none", "max_abs_advantage": None}
ESTIMATORS: dict[str, EstimatorSpec] = {
    "grpo": EstimatorSpec("GRPO", "grpo"),
    "drgrpo": EstimatorSpec("Dr.GRPO", "grpo", {"norm_adv_by_std_in_grpo": False}),
    "rloo": EstimatorSpec("RLOO", "rloo"),
    "reinforce_pp": EstimatorSpec("REINFORCE++", "reinforce_plus_plus"),
    "bv_sem": bv_blend("BV-Blend sem (defaults)"),
    "bv_fixed": bv_blend("BV-Blend fixed w=0.5", weight_mode="fixed", fixed_weight=0.5),
    "bv_neff": bv_blend("BV-Blend N_eff only", weight_mode="neff"),
    "bv_sigma": bv_blend("BV-Blend sigma only", weight_mode="sigma"),
    "bv_sem_literal": bv_blend("BV-Blend sem, paper-literal", weight_mode="sem", **LITERAL),
    "bv_fixed_literal": bv_blend("BV-Blend fixed, paper-literal", weight_mode="fixed", fixed_weight=0.5, **LITERAL),
    "bv_neff_literal": bv_blend("BV-Blend N_eff, paper-literal", weight_mode="neff", **LITERAL),
    "bv_sigma_literal": bv_blend("BV-Blend sigma, paper-literal", weight_mode="sigma", **LITERAL),
    "bv_sem_floor_only": bv_blend("BV-Blend sem, floor only", variance_floor="prior", max_abs_advantage=None),
    "bv_sem_clip_only": bv_blend("BV-Blend sem, auto clip only", variance_floor="none", max_abs_advantage="auto"),
    "bv_sem_clip5": bv_blend("BV-Blend sem, max_abs_advantage 5", max_abs_advantage=5.0),
    # Bounded BV-Blend (companions spec 4): s = max(s_BV, max |R - b|, tau), |A| <= 1.
    "bv_bounded": bv_blend("BV-Blend sem, bounded scale (tau 0.01)", bounded_scale_tau=0.01),
    # History below the cluster (history_spec 2-3): SPO's per-prompt tracker and BV-Blend's prompt levels.
    "spo": EstimatorSpec("SPO", "spo", {"spo": {}}),
    "bv_prompt": bv_blend("BV-Blend sem, prompt level", history_level="prompt"),
    "bv_prompt_cluster": bv_blend("BV-Blend sem, prompt_and_cluster", history_level="prompt_and_cluster"),
    # Companion estimators, through verl's registry like the rest.
    "ha_dw": EstimatorSpec("HA-DW (GRPO)", "ha_dw", {"ha_dw": {}}),
    "maxnorm_ac": EstimatorSpec("MaxNorm-RLOO", "maxnorm_ac", {"maxnorm": {}}),
    ORACLE: EstimatorSpec("oracle R - p (reference)", ORACLE),
}


def unavailable_reason(spec: EstimatorSpec) -> str | None:
    """Why this installation cannot run ``spec``, or None when it can."""
    name = spec.adv_estimator
    if name == ORACLE:
        return None
    if name not in offline.registered_estimators():
        return f"verl has no advantage estimator {name!r} registered in this installation"
    record = record_for(name)
    if record is not None:
        options = spec.options.get(record.section, {})
        try:
            record.options_class().from_algorithm(offline.algorithm_config(name, spec.options))
        except (TypeError, ValueError) as error:
            first_sentence = str(error).split(". ")[0].rstrip(".")
            return f"this version rejects {record.option_section} {dict(options)}: {first_sentence}"
    return None


def sampler_reason(spec: EstimatorSpec, sampler: str) -> str | None:
    """Why ``spec`` cannot run with ``sampler`` (the history sampler reads a history the estimator must keep)."""
    if sampler != "history":
        return None
    record = record_for(spec.adv_estimator)
    if record is None or record.success_estimates is None:
        return f"the history sampler reads a per-prompt or per-cluster history, and {spec.label} keeps none"
    return None


def bv_blend_config(spec: EstimatorSpec) -> BVBlendConfig | None:
    """The full BV-Blend config a spec resolves to (defaults filled in), for the report."""
    if spec.adv_estimator != "bv_blend" or unavailable_reason(spec) is not None:
        return None
    return BVBlendConfig.from_mapping(dict(spec.options.get("bv_blend", {})))


class Advantages:
    """One run's estimator: starts with an empty history, then maps a step's rewards to advantages."""

    def __init__(self, spec: EstimatorSpec, num_clusters: int) -> None:
        reason = unavailable_reason(spec)
        if reason is not None:
            raise ValueError(f"Cannot run {spec.label}: {reason}.")
        self.spec = spec
        self.oracle = spec.adv_estimator == ORACLE
        if not self.oracle:
            self.algorithm = offline.algorithm_config(spec.adv_estimator, spec.algorithm_options(num_clusters))
            offline.reset_history(spec.adv_estimator)

    def success_estimates(self, prompt_keys: np.ndarray, cluster_ids: np.ndarray) -> np.ndarray:
        """Every prompt's p^ from this estimator's history, as verl's prompt sampler reads it (history_spec 5)."""
        return offline.success_estimates(self.algorithm, prompt_keys, cluster_ids)

    def __call__(
        self,
        rewards: np.ndarray,
        uids: np.ndarray,
        cluster_ids: np.ndarray,
        success_prob: np.ndarray,
        prompt_keys: np.ndarray | None = None,
    ) -> np.ndarray:
        """(P, G) advantages for (P, G) rewards of P prompts (their uids, cluster ids, true success prob and keys)."""
        if self.oracle:
            return rewards - success_prob[:, None]
        num_prompts, group_size = rewards.shape
        token_level_rewards = torch.from_numpy(rewards.reshape(-1, 1).astype(np.float32))
        response_mask = torch.ones_like(token_level_rewards, dtype=torch.int64)
        advantages = offline.compute_advantages(
            token_level_rewards,
            response_mask,
            np.repeat(uids, group_size),
            self.algorithm,
            cluster_ids=np.repeat(cluster_ids, group_size),
            prompt_keys=None if prompt_keys is None else np.repeat(prompt_keys, group_size),
        )
        return advantages[:, -1].numpy().astype(np.float64).reshape(num_prompts, group_size)
