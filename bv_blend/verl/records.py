"""One record per estimator: everything the verl glue knows about an estimator, declared once.

Every table the glue needs is derived from :data:`RECORDS`: what the plugin registers in verl, which trainer runs
the hooks act on, which per-batch inputs they publish, which checkpoint files they write, which histories the lab
resets, and which stacks trainer start refuses. Adding an estimator takes three things: its verl-free math module,
its glue module (the function verl calls and its options class, ``bv_blend/verl/glue/``) and one record here
(docs/architecture.md, "Adding an estimator").

This module is imported by the plugin in every verl process, so it imports nothing but the standard library: the
glue is named by ``"module:attribute"`` and imported only when verl imports its estimator registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The per-batch inputs a trainer hook can publish for an estimator (bv_blend.verl.channel), besides verl's own.
CLUSTER_IDS = "cluster_ids"  # uid -> the prompt's cluster id, from extra_info (the offline codebook)
PROMPT_KEYS = "prompt_keys"  # uid -> the prompt's stable key (history_spec 1)

# Parts a run can stack on its estimator (bv_blend.verl.compositions reads them from the config).
REWARD_BINNING, SKIP_ZERO_GAP, DIFFICULTY_WEIGHTING = "reward_binning", "skip_zero_gap", "difficulty_weighting"
BOUNDED_SCALE, KL_IN_REWARD = "bounded_scale", "use_kl_in_reward"


def resolve(reference: str) -> Any:
    """The object named ``"package.module:attribute"``, imported on first use."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Request:
    """A part that an estimator's options stack on a run of another estimator (``compositions.composition_of``).

    Attributes:
        part: the part (:data:`REWARD_BINNING` ...).
        key: the option that turns it on (set to anything but null or false; absent, its default); ``None``: any
            option of the section set off its default.
        with_section: ``key`` counts only when some option of the section is set off its default too.
        why: how the config asks for it and the fix, ``{options}`` standing for the options that ask;
            empty for a part whose request another part's reason states already.
    """

    part: str
    key: str | None = None
    with_section: bool = False
    why: str = ""


@dataclass(frozen=True)
class EstimatorRecord:
    """How the glue runs one estimator.

    Attributes:
        name: its ``algorithm.adv_estimator`` name in verl's registry.
        label: its name in messages.
        function: ``"module:function"`` verl calls, shaped like its neighbours in ``core_algos.py``.
        options: ``"module:Class"`` of its glue options (a ``bv_blend.verl.options.GlueOptions``): reads and
            validates ``algorithm.<section>``, builds the process's estimator, saves and restores its history.
        section: where its options live, ``algorithm.<section>``.
        state_file: its history's file in every ``global_step_N/``; ``None`` for an estimator without history.
        inputs: the per-batch inputs it may need (:data:`CLUSTER_IDS`, :data:`PROMPT_KEYS`); its options say which a
            run needs (the prompt level of BV-Blend needs no cluster ids).
        hosts: the parts it can take on top (a part that no estimator of the run hosts is refused).
        requests: the parts its options put on a run of another estimator, when they are set there.
        refuses: part -> why it is refused on this estimator (the reason and the fix, shown at trainer start).
        options_elsewhere_refused: its options, set while another estimator runs, are an error (they would be
            ignored); false where configs declare the section for every run (BV-Blend's paper comparisons).
        success_estimates: the method of its built object (what its options' ``build`` returns) that gives each
            prompt's estimated success rate from its history, ``(keys, cluster_ids) -> (p^, known)``, for the prompt
            sampler; ``None`` for an estimator without a per-prompt or per-cluster history, which the sampler refuses.
    """

    name: str
    label: str
    function: str
    options: str
    section: str
    state_file: str | None = None
    inputs: frozenset[str] = frozenset()
    hosts: frozenset[str] = frozenset()
    requests: tuple[Request, ...] = ()
    refuses: Mapping[str, str] = field(default_factory=dict)
    options_elsewhere_refused: bool = True
    success_estimates: str | None = None

    @property
    def option_section(self) -> str:
        return f"algorithm.{self.section}"

    @property
    def stateful(self) -> bool:
        return self.state_file is not None

    @property
    def state_format(self) -> str:
        """The marker inside its checkpoint file."""
        return f"bv_blend.{self.name}_state"

    def options_class(self) -> Any:
        return resolve(self.options)

    def compute_function(self) -> Any:
        return resolve(self.function)


RECORDS: tuple[EstimatorRecord, ...] = (
    EstimatorRecord(
        name="bv_blend",
        label="BV-Blend",
        function="bv_blend.verl.glue.bv_blend:compute_bv_blend_advantage",
        options="bv_blend.verl.glue.bv_blend:BVBlendOptions",
        section="bv_blend",
        state_file="bv_blend_state.pt",
        inputs=frozenset({CLUSTER_IDS, PROMPT_KEYS}),
        hosts=frozenset({BOUNDED_SCALE, REWARD_BINNING}),
        requests=(Request(BOUNDED_SCALE, key="bounded_scale_tau", why="{options} is set, but it bounds only bv_blend's "
                          "scale (set it null)"),),  # fmt: skip
        refuses={
            SKIP_ZERO_GAP: "The RRP zero-gap skip cannot run with BV-Blend: it deletes exactly the groups BV-Blend "
            "exists for, the zero-variance groups (an all-wrong group of an easy cluster) that BV-Blend gives a "
            "history-based signal. Keep the RRP binning (reward_binning) and turn skip_zero_gap off.",
            DIFFICULTY_WEIGHTING: "HA-DW's weight is not stacked on BV-Blend: on zero-variance groups (outside "
            "HA-DW's theory) Phi shrinks both of BV-Blend's signals by exp(-|p - a|), and on mixed groups it moves "
            "the baseline away from the anchor while BV-Blend moves it toward the cluster mean, so the two partly "
            "cancel. The spec rates the stack an ablation at best; compare ha_dw and bv_blend as separate runs.",
        },
        # The paper's comparison configs (paper/grpo, ...) inherit the main run's algorithm.bv_blend section.
        options_elsewhere_refused=False,
        success_estimates="success_estimates",
    ),
    EstimatorRecord(
        name="spo",
        label="SPO",
        function="bv_blend.verl.glue.spo:compute_spo_advantage",
        options="bv_blend.verl.glue.spo:SPOOptions",
        section="spo",
        state_file="spo_state.pt",
        inputs=frozenset({PROMPT_KEYS}),
        refuses={
            SKIP_ZERO_GAP: "algorithm.filter_groups (DAPO's dynamic sampling) cannot run with spo: it drops every "
            "group whose rewards are all equal, and at SPO's one rollout per prompt that is every group. SPO's batch "
            "normalisation (and its tracker, once a prompt comes back or from priors) gives single rollouts their "
            "signal; turn filter_groups off.",
        },
        success_estimates="success_estimates",
    ),
    EstimatorRecord(
        name="ha_dw",
        label="HA-DW",
        function="bv_blend.verl.glue.ha_dw:compute_ha_dw_advantage",
        options="bv_blend.verl.glue.ha_dw:HADWOptions",
        section="ha_dw",
        state_file="ha_dw_state.pt",
        requests=(Request(DIFFICULTY_WEIGHTING, why="{options} asks for HA-DW's weight (run adv_estimator=ha_dw "
                          "instead)"),),  # fmt: skip
    ),
    EstimatorRecord(
        name="maxnorm_ac",
        label="MaxNorm-AC",
        function="bv_blend.verl.glue.maxnorm_ac:compute_maxnorm_ac_advantage",
        options="bv_blend.verl.glue.maxnorm_ac:MaxNormOptions",
        section="maxnorm",
        requests=(
            Request(REWARD_BINNING, why="{options} asks for the RRP (run adv_estimator=maxnorm_ac instead)"),
            Request(SKIP_ZERO_GAP, key="skip_zero_gap", with_section=True),
        ),
        hosts=frozenset({REWARD_BINNING, SKIP_ZERO_GAP}),
        refuses={
            DIFFICULTY_WEIGHTING: "HA-DW's weight cannot be stacked on MaxNorm-AC: Phi = lambda exp(D |diff|) "
            "reaches lambda e, so it breaks the bound |A| <= 1 that is MaxNorm's point. Run ha_dw or maxnorm_ac, "
            "not both.",
            KL_IN_REWARD: "maxnorm_ac cannot run with algorithm.use_kl_in_reward=true: the reward would then include "
            "-beta KL, leave the reward grid that the RRP bins on, and be divided by the scale s_g, which the source "
            "never applies to the KL term. Use actor_rollout_ref.actor.use_kl_loss instead (or no KL).",
        },
    ),
)

# Policy losses this package registers in verl: loss_mode -> "module:function".
POLICY_LOSSES = {"ntf": "bv_blend.verl.glue.ntf:compute_policy_loss_ntf"}

BY_NAME: dict[str, EstimatorRecord] = {record.name: record for record in RECORDS}
# Why a part needs an estimator that hosts it, for a run whose estimator does not.
NEEDS_A_HOST = {
    BOUNDED_SCALE: "bounded_scale is an option of bv_blend (s = max(s_BV, max |R - b|, tau)); maxnorm_ac is bounded "
    "already, and other estimators have no blended scale to bound.",
    REWARD_BINNING: "The Reward-Resolution Protocol is built into maxnorm_ac (binning before bv_blend is sound, "
    "without the zero-gap skip); this estimator has no RRP stage. Select maxnorm_ac, or remove the RRP options.",
    SKIP_ZERO_GAP: "The Reward-Resolution Protocol is built into maxnorm_ac (binning before bv_blend is sound, "
    "without the zero-gap skip); this estimator has no RRP stage. Select maxnorm_ac, or remove the RRP options.",
}


def record_for(name: Any) -> EstimatorRecord | None:
    """The record of estimator ``name``, or ``None`` for an estimator this package does not provide."""
    return BY_NAME.get(str(name))


__all__ = [
    "BY_NAME",
    "CLUSTER_IDS",
    "NEEDS_A_HOST",
    "POLICY_LOSSES",
    "PROMPT_KEYS",
    "RECORDS",
    "EstimatorRecord",
    "Request",
    "record_for",
    "resolve",
]
