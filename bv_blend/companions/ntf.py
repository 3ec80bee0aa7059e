"""Negative token filtering (arXiv 2606.17250), companions spec section 1: which tokens a policy loss keeps.

For row i with n_i valid tokens (the spec's "Per call" steps):

    (1) N_i  = valid tokens with A_{i,t} < 0                       the sign is read per token
    (2) k_i  = max(1, ceil(round(rho n_i, 6)))                     round() keeps float error from adding a token
    (3) K_i  = the k_i valid tokens of the row with the smallest old_log_prob, ties to the earlier position
    (4) keep = 1 where t is not in N_i or t is in K_i, else 0
    (5) the loss runs with rollout_is_weights = keep * (rollout_is_weights or 1) and the ORIGINAL mask

So a filtered token adds 0 to the loss but keeps its place in every denominator, under every ``loss_agg_mode``.
K_i ranks all valid tokens of the row ("the top 90% by probability within their sequence", paper section 2.3); with
outcome rewards a row's sign is constant, so that is the same as ranking its negative tokens.

Tensors in, tensors out, on the device of the inputs: this runs in the actor workers, inside the loss. The
selection is one stable sort of each row (the row's k_i varies, so ``topk``/``kthvalue`` with one k do not fit, and
``topk`` is not stable on ties).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bv_blend.core.options import OptionsMixin, check_number, require

SECTION = "actor_rollout_ref.actor.policy_loss"


@dataclass(frozen=True)
class NTFConfig(OptionsMixin):
    """Parameters of negative token filtering.

    Attributes:
        keep_ratio: rho, the share of each negative row's valid tokens that stays in the loss (its least likely
            ones); the paper's 10%. 1 keeps every token (the loss is then ``vanilla``'s).
    """

    SECTION = SECTION

    keep_ratio: float = 0.1

    def __post_init__(self) -> None:
        check_number(SECTION, "keep_ratio", self.keep_ratio)
        require(
            0 < self.keep_ratio <= 1, SECTION, "keep_ratio", self.keep_ratio, "must be in (0, 1]: a share of tokens"
        )


def keep_counts(valid_tokens: torch.Tensor, keep_ratio: float) -> torch.Tensor:
    """k_i = max(1, ceil(round(rho n_i, 6))) for each row's valid-token count n_i, as int64.

    rho n_i is computed in float64 and rounded to 6 decimals first, so 0.1 * 30 = 3.0000000000000004 keeps 3
    tokens, not 4. (Rounding half to even at the sixth decimal cannot move the ceiling at any rho a config holds.)
    """
    NTFConfig(keep_ratio)  # the same validation as the config's
    share = torch.round(valid_tokens.to(torch.float64) * keep_ratio, decimals=6)
    return torch.ceil(share).clamp_min(1).to(torch.int64)


def keep_mask(
    old_log_prob: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, keep_ratio: float
) -> torch.Tensor:
    """The (B, T) bool mask of tokens that stay in the loss: every non-negative token, and of each row's negative
    tokens only those among its k_i least likely (by ``old_log_prob``).

    Args:
        old_log_prob: (B, T) log-probabilities under the policy that generated the batch; fixed across PPO epochs
            and micro-batches, so the selection is too (and on the first epoch it is the current policy's).
        advantages: (B, T) advantages; a token is negative where its advantage is < 0.
        response_mask: (B, T) bool or 0/1; padding tokens (and all-padding rows) are never filtered.

    Raises:
        ValueError: shapes differ, or a valid token's ``old_log_prob`` is NaN (the ranking would be arbitrary).
    """
    if not old_log_prob.shape == advantages.shape == response_mask.shape or response_mask.dim() != 2:
        raise ValueError(
            f"old_log_prob {tuple(old_log_prob.shape)}, advantages {tuple(advantages.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must all be (batch, response_length)."
        )
    valid = response_mask.bool()
    if torch.isnan(old_log_prob).logical_and(valid).any():
        rows = torch.isnan(old_log_prob).logical_and(valid).any(dim=-1).nonzero().flatten()[:5].tolist()
        raise ValueError(
            f"old_log_prob is NaN at valid tokens of rows {rows}: negative token filtering ranks tokens by it. "
            "Check the old-policy log-prob computation."
        )
    negative = valid & (advantages < 0)
    counts = keep_counts(valid.sum(dim=-1), keep_ratio)

    # Rank the valid tokens of each row by old_log_prob, least likely first; padding sorts last. A stable sort
    # sends ties to the earlier position.
    key = old_log_prob.detach().masked_fill(~valid, math.inf)
    order = torch.sort(key, dim=-1, stable=True).indices
    positions = torch.arange(key.shape[-1], device=key.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, positions)
    least_likely = valid & (rank < counts.unsqueeze(-1))
    return ~negative | least_likely


def keep_weights(keep: torch.Tensor, rollout_is_weights: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The ``rollout_is_weights`` to hand ``vanilla``: keep (as ``dtype``) times the incoming weights, if any.

    verl multiplies the per-token losses by these weights before ``agg_loss``, which still uses the original mask.
    """
    weights = keep.to(dtype)
    return weights if rollout_is_weights is None else weights * rollout_is_weights


def ntf_metrics(
    old_log_prob: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, keep: torch.Tensor
) -> dict[str, float]:
    """``ntf/*`` metrics of one loss call, read back in one device-to-host copy.

    Every key is always present, with 0 where its denominator is empty (a micro-batch without negative tokens has
    ``ntf/kept_frac_of_neg`` = 0): verl's ``Metric.aggregate_dp`` needs the same keys and counts on every data-parallel
    rank, so leaving an undefined value out would crash a multi-GPU run. verl logs the mean over micro-batches, so
    such micro-batches pull the logged value toward 0 (docs/companions.md).
    """
    valid = response_mask.bool()
    negative = valid & (advantages < 0)
    kept, masked = negative & keep, negative & ~keep
    log_prob = old_log_prob.detach().to(torch.float64)
    zero = log_prob.new_zeros(())
    tokens, negatives, rows, negative_rows, num_kept, num_masked, kept_sum, masked_sum = torch.stack(
        [
            valid.sum().to(torch.float64),
            negative.sum().to(torch.float64),
            valid.any(dim=-1).sum().to(torch.float64),
            negative.any(dim=-1).sum().to(torch.float64),
            kept.sum().to(torch.float64),
            masked.sum().to(torch.float64),
            torch.where(kept, log_prob, zero).sum(),  # where, not a product: -inf * 0 would be NaN
            torch.where(masked, log_prob, zero).sum(),
        ]
    ).tolist()
    return {
        "ntf/neg_token_frac": negatives / tokens if tokens else 0.0,
        "ntf/neg_row_ratio": negative_rows / rows if rows else 0.0,
        "ntf/kept_frac_of_neg": num_kept / negatives if negatives else 0.0,
        "ntf/kept_logprob_mean": kept_sum / num_kept if num_kept else 0.0,
        "ntf/masked_logprob_mean": masked_sum / num_masked if num_masked else 0.0,
    }


__all__ = ["NTFConfig", "keep_counts", "keep_mask", "keep_weights", "ntf_metrics"]
