"""The policy loss verl calls for ``actor_rollout_ref.actor.policy_loss.loss_mode=ntf``, and its config.

Negative token filtering (arXiv 2606.17250; companions spec section 1) keeps, of each negative row, only its least
likely tokens (by ``old_log_prob``) in the loss. The loss is verl's own ``vanilla`` with the keep mask folded into
``rollout_is_weights``: verl multiplies the per-token losses by those weights *before* ``agg_loss``, which still uses
the original mask, so a filtered token adds 0 and keeps its place in every denominator, under every
``loss_agg_mode``. The mask math is :mod:`bv_blend.companions.ntf`.

The keep ratio reaches the actor workers through verl's own config instantiation: ``policy_loss._target_`` names
:class:`NTFPolicyLossConfig`, a ``PolicyLossConfig`` with one more field. Hydra builds it in the driver's config
check and in every worker, a misspelt key is a ``TypeError`` there, and no verl code is patched
(docs/companions.md, "The keep ratio's route to the workers").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from verl.workers.config import PolicyLossConfig

from bv_blend.companions import NTFConfig, keep_mask, keep_weights, ntf_metrics

LOSS_NAME = "ntf"
KEEP_RATIO_KEY = "ntf_keep_ratio"
SECTION = "actor_rollout_ref.actor.policy_loss"
TARGET = f"{__name__}.NTFPolicyLossConfig"
DEFAULT_KEEP_RATIO = NTFConfig().keep_ratio


@dataclass
class NTFPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus the NTF keep ratio.

    Select it with ``actor_rollout_ref.actor.policy_loss._target_=bv_blend.verl.glue.ntf.NTFPolicyLossConfig``.

    Args:
        ntf_keep_ratio: rho, the share of each negative row's valid tokens that stays in the loss (its least likely
            ones). ``None`` means the paper's 0.1. Setting it with a ``loss_mode`` other than ``ntf`` is an error,
            since it would do nothing.
    """

    ntf_keep_ratio: Optional[float] = None  # noqa: UP045 - verl's configs spell optional fields this way

    def __post_init__(self) -> None:
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        ratio = self.ntf_keep_ratio
        if ratio is None:
            return
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio):
            raise ValueError(f"{SECTION}.{KEEP_RATIO_KEY}={ratio!r} is invalid: it must be a number in (0, 1].")
        if not 0 < ratio <= 1:
            raise ValueError(
                f"{SECTION}.{KEEP_RATIO_KEY}={ratio!r} is invalid: it must be in (0, 1], the share of a negative "
                "row's tokens that stays in the loss (the paper's 0.1)."
            )
        if self.loss_mode != LOSS_NAME:
            raise ValueError(
                f"{SECTION}.{KEEP_RATIO_KEY}={ratio!r} is set but {SECTION}.loss_mode={self.loss_mode!r}: the keep "
                f"ratio acts only with loss_mode={LOSS_NAME}. Set loss_mode={LOSS_NAME}, or {KEEP_RATIO_KEY}=null."
            )


def keep_ratio_of(config: Any) -> float:
    """rho from the actor config's ``policy_loss`` (verl's plain ``PolicyLossConfig`` has none: the default)."""
    policy_loss = getattr(config, "policy_loss", None)
    ratio = policy_loss.get(KEEP_RATIO_KEY) if policy_loss is not None else None
    return DEFAULT_KEEP_RATIO if ratio is None else float(ratio)


def compute_policy_loss_ntf(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's ``vanilla`` clipped policy loss in which, of each negative row, only the least likely tokens count.

    Args (verl's policy-loss signature):
        old_log_prob: (bs, response_length) log-probs of the policy that sampled the batch; they rank the tokens.
        log_prob: (bs, response_length) log-probs of the current policy.
        advantages: (bs, response_length); a token is negative where its advantage is < 0.
        response_mask: (bs, response_length) bool; the denominators of every ``loss_agg_mode`` stay on it.
        loss_agg_mode: verl's aggregation mode.
        config: the actor's ``ActorConfig``; the keep ratio is ``config.policy_loss.ntf_keep_ratio``.
        rollout_is_weights: verl's rollout-correction weights, if any; multiplied by the keep mask.

    Returns:
        ``(pg_loss, metrics)``: ``vanilla``'s, with the ``ntf/*`` metrics added.
    """
    # Imported here, not at the top: hydra may import this module (for the config class) before core_algos, whose
    # import then runs the plugin's registration, which needs this module's loss function already defined.
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    keep = keep_mask(old_log_prob, advantages, response_mask, keep_ratio_of(config))
    weights_dtype = rollout_is_weights.dtype if rollout_is_weights is not None else log_prob.dtype
    pg_loss, metrics = compute_policy_loss_vanilla(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=keep_weights(keep, rollout_is_weights, weights_dtype),
    )
    metrics.update(ntf_metrics(old_log_prob, advantages, response_mask, keep))
    return pg_loss, metrics


__all__ = ["LOSS_NAME", "TARGET", "NTFPolicyLossConfig", "compute_policy_loss_ntf", "keep_ratio_of"]
