"""`SPOEstimator`: SPO's per-prompt Beta tracker as an advantage estimator (arXiv 2509.13232; history_spec 2).

One call, for valid rows i of prompts p (the spec's steps; the advantages use the tracker from before the call):

    (1) p^_p  = alpha_p / (alpha_p + beta_p)          prior 0.5 / 0.5, or from offline values (below)
    (2) a_i   = r_i - p^_p(i)
    (3) A_i   = (a_i - mean(a)) / (std(a) + 1e-8)     over the call's valid rows; std unbiased; one row: A = a
    (4) per prompt key p in the call (one visit, whatever its rows n_p; R_p the sum of its rewards):
        alpha_p <- rho alpha_p + R_p,   beta_p <- rho beta_p + (n_p - R_p)

A prompt not in the call is left unchanged: there is no decay between visits. With offline values (N scores s of the
initial policy) a prompt starts at alpha = N_init (sum s + 0.5) / (N + 1), beta = N_init (N - sum s + 0.5) / (N + 1),
N_init = 1 / (1 - rho_min). Rewards must lie in [0, 1] (the tracker is a Beta posterior).

When torch.distributed runs with several ranks, the batch normalisation's sums are all-reduced and the visits
all-gathered, so every rank ends the call with the same tracker. docs/history.md documents every choice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from bv_blend.core.groups import group_stats
from bv_blend.core.options import (
    OptionsMixin,
    check_bool,
    check_number,
    check_state_config,
    check_state_count,
    check_state_format,
    require,
)
from bv_blend.core.rows import GroupIds, Rows, read_rows, to_tensor, token_level
from bv_blend.core.sync import Reduced, all_gather, should_sync
from bv_blend.history.keys import group_prompt_keys
from bv_blend.history.table import PromptTable, group_visits

SECTION = "algorithm.spo"
STATE_FORMAT_VERSION = 1
REWARD_RANGE = (0.0, 1.0)
FIXED_RANGE = "SPO's tracker is a Beta posterior of the success rate"  # history_spec 2: no option widens it
PRIOR = 0.5  # alpha = beta = 0.5 for a prompt without offline values (the recipe's)


@dataclass(frozen=True)
class SPOConfig(OptionsMixin):
    """Parameters of SPO (``algorithm.spo.*`` in a verl config).

    Attributes:
        rho: the decay per visit, in (0, 1]; 0.875 is the recipe's constant mode (``rho.value``).
        rho_min: sets the weight of offline values, N_init = 1 / (1 - rho_min); 0.875 gives 8 (the recipe's).
        epsilon: added to the batch standard deviation (the recipe's 1e-8).
        sync_across_ranks: all-reduce the batch normalisation and gather the visits when torch.distributed runs
            with more than one rank.
    """

    SECTION = SECTION

    rho: float = 0.875
    rho_min: float = 0.875
    epsilon: float = 1e-8
    sync_across_ranks: bool = True

    def __post_init__(self) -> None:
        for name in ("rho", "rho_min", "epsilon"):
            check_number(SECTION, name, getattr(self, name))
        require(0.0 < self.rho <= 1.0, SECTION, "rho", self.rho, "must be in (0, 1]: the decay per visit")
        why = "must be in [0, 1): N_init = 1 / (1 - rho_min)"
        require(0.0 <= self.rho_min < 1.0, SECTION, "rho_min", self.rho_min, why)
        require(self.epsilon > 0.0, SECTION, "epsilon", self.epsilon, "must be > 0: a constant batch divides by it")
        check_bool(SECTION, "sync_across_ranks", self.sync_across_ranks)

    @property
    def offline_weight(self) -> float:
        """N_init, the effective number of visits that offline values are worth."""
        return 1.0 / (1.0 - self.rho_min)


@dataclass
class BatchSums(Reduced):
    """(3) What the batch normalisation and the metrics add up over the call's valid rows, summed across ranks."""

    centred: float  # sum of a = r - p^
    rows: float  # valid rows
    p_hat: float  # sum of p^ (the metrics)
    n_eff: float  # sum of alpha + beta (the metrics)
    failed: float = 0.0  # 1 on a rank whose input was rejected, so that every rank learns of it in the same call

    @classmethod
    def zeros(cls, failed: bool = False) -> BatchSums:
        return cls(0.0, 0.0, 0.0, 0.0, float(failed))


@dataclass
class Spread(Reduced):
    """(3) The sum of squared deviations from the batch mean, summed across ranks."""

    squares: float


class Visits(NamedTuple):
    """(1) One call's visits, one per prompt key, and what each row reads from the tracker before the call."""

    keys: list[str]  # the distinct prompt keys of the call's valid rows
    rewards: np.ndarray  # (V,) R_p, the sum of each prompt's rewards
    counts: np.ndarray  # (V,) n_p, its valid rows
    p_hat: np.ndarray  # (B,) each valid row's p^ = alpha / (alpha + beta), 0 on invalid rows
    n_eff: np.ndarray  # (B,) each valid row's alpha + beta, 0 on invalid rows


class Advantages(NamedTuple):
    """(2, 3) The call's advantages and the batch statistics they were normalised with."""

    value: np.ndarray  # (B,) A_i, 0 on invalid rows
    sums: BatchSums
    mean: float  # of a over the valid rows
    std: float  # of a over the valid rows (unbiased; 0 below two rows)


def offline_prior(scores: Sequence[float], weight: float) -> tuple[float, float]:
    """(alpha, beta) of a prompt with offline scores s_1..s_N: N_init (sum s + 0.5) / (N + 1) and
    N_init (N - sum s + 0.5) / (N + 1)."""
    total, n = float(np.sum(scores)), float(len(scores))
    return weight * (total + 0.5) / (n + 1.0), weight * (n - total + 0.5) / (n + 1.0)


class SPOEstimator:
    """Advantages against each prompt's Beta-tracked success rate, normalised over the batch.

    Args:
        config: the parameters; defaults to ``SPOConfig()``.
        offline_values: prompt key -> scores of the initial policy (history_spec 4), the prior of those prompts.
    """

    def __init__(self, config: SPOConfig | None = None, offline_values: Mapping[str, Sequence[float]] | None = None):
        self.config = config if config is not None else SPOConfig()
        if not isinstance(self.config, SPOConfig):
            raise TypeError(f"config must be an SPOConfig, got {type(self.config).__name__}.")
        self.tracker = PromptTable(("alpha", "beta"), "SPO")
        self.offline_values = dict(offline_values or {})
        self.priors = PromptTable(("alpha", "beta"), "SPO offline values")
        if offline_values:
            keys = list(offline_values)
            self.priors.commit(keys, np.array([offline_prior(offline_values[k], self.config.offline_weight)
                                               for k in keys]).T)  # fmt: skip
        self.num_updates = 0
        self.metrics: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------------ faces
    def compute(
        self,
        rewards: torch.Tensor,
        group_ids: GroupIds,
        prompt_keys: Sequence[str] | np.ndarray,
        valid: torch.Tensor | np.ndarray | None = None,
    ) -> torch.Tensor:
        """Sequence-level advantages, one per row, then fold each prompt's visit into its tracker.

        Args:
            rewards: (B,) float rewards in [0, 1].
            group_ids: (B,) prompt-group ids (uid strings, as verl passes them, or ints).
            prompt_keys: (B,) each row's prompt key (history_spec 1); padding rows may hold anything.
            valid: optional (B,) bool; False marks padding rows, as does a uid starting with "pad".

        Raises:
            ValueError: rewards outside [0, 1] or not finite, a valid row without a prompt key, a group whose rows
                carry different keys, or inputs of different lengths. The tracker is left exactly as it was.
        """
        sync = should_sync(self.config.sync_across_ranks)
        try:
            keys = np.asarray(prompt_keys, dtype=object)
            rows = read_rows(rewards, group_ids, valid, REWARD_RANGE, SECTION, FIXED_RANGE, prompt_keys=keys)
            group_key = group_prompt_keys(rows, keys, "SPO")
        except (ValueError, TypeError):
            if sync:
                BatchSums.zeros(failed=True).all_reduce()  # the other ranks raise too instead of waiting
            raise
        visits = self._visits(rows, group_key)
        advantages = self._advantages(rows, visits, sync)
        self._commit(visits, advantages, sync)
        return to_tensor(advantages.value, rewards)

    def compute_token_level(
        self,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        group_ids: GroupIds,
        prompt_keys: Sequence[str] | np.ndarray,
        valid: torch.Tensor | np.ndarray | None = None,
        source_rows: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """verl's estimator face: (B, T) rewards and mask in, ``(advantages, returns)`` shaped like the mask (the
        sequence advantage broadcast over the response tokens); ``source_rows`` as for BV-Blend."""
        return token_level(
            lambda rewards, counted: self.compute(rewards, group_ids, prompt_keys, valid=counted),
            token_level_rewards, response_mask, valid, source_rows,
        )  # fmt: skip

    def success_estimates(
        self, keys: Sequence[str] | np.ndarray, cluster_ids: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(p^, known) per key, for the prompt sampler: alpha / (alpha + beta) (the tracker's, else the offline prior's,
        else 0.5), and whether the tracker gave it. SPO keeps no cluster history: ``cluster_ids`` are not read."""
        alpha, beta, rows = self._beta(list(keys))
        return alpha / (alpha + beta), rows >= 0

    # ------------------------------------------------------------------------------------------------- math
    def _visits(self, rows: Rows, group_key: np.ndarray) -> Visits:
        """(1) The call's visits, one per prompt key, and each valid row's p^ and alpha + beta from the tracker
        before the call."""
        groups = group_stats(rows)
        present = groups.count > 0
        keys, (rewards, counts), visit_of_present = group_visits(
            group_key[present], (groups.total[present], groups.count[present])
        )
        alpha, beta, _ = self._beta(keys)
        visit_of_group = np.zeros(rows.num_groups, dtype=np.int64)  # groups without a valid row: masked below
        visit_of_group[present] = visit_of_present
        visit_of_row = visit_of_group[rows.codes]
        p_hat = np.where(rows.valid, (alpha / (alpha + beta))[visit_of_row] if keys else 0.0, 0.0)
        n_eff = np.where(rows.valid, (alpha + beta)[visit_of_row] if keys else 0.0, 0.0)
        return Visits(keys, rewards, counts, p_hat, n_eff)

    def _advantages(self, rows: Rows, visits: Visits, sync: bool) -> Advantages:
        """(2, 3) a = r - p^, normalised over the call's valid rows (all ranks' rows when syncing); one row: A = a.

        Exactly rounded sums (fsum): the order of the rows and the padding rows cannot change the last bit.
        """
        centred = np.where(rows.valid, rows.reward - visits.p_hat, 0.0)
        sums = BatchSums(math.fsum(centred), float(rows.valid.sum()), math.fsum(visits.p_hat), math.fsum(visits.n_eff))
        if sync:
            sums = sums.all_reduce()
            if sums.failed:
                raise ValueError("Another rank's input for this call was rejected (its own error says why); no rank "
                                 "changed its SPO tracker. Fix that input and call again on every rank.")  # fmt: skip
        mean = sums.centred / max(sums.rows, 1.0)
        spread = Spread(math.fsum(np.where(rows.valid, (centred - mean) ** 2, 0.0)))
        spread = spread.all_reduce() if sync else spread
        std = math.sqrt(spread.squares / (sums.rows - 1.0)) if sums.rows >= 2 else 0.0
        normalised = np.where(rows.valid, (centred - mean) / (std + self.config.epsilon), 0.0)
        return Advantages(normalised if sums.rows >= 2 else centred, sums, mean, std)

    def _commit(self, visits: Visits, advantages: Advantages, sync: bool) -> None:
        """(4) One visit per prompt key (every rank's, when syncing): alpha <- rho alpha + R and
        beta <- rho beta + (n - R); then the call's metrics."""
        keys, rewards, counts = visits.keys, visits.rewards, visits.counts
        if sync:
            keys, rewards, counts = self._gathered(keys, rewards, counts)
        alpha, beta, rows_before = self._beta(keys)
        rho = self.config.rho
        new_values = np.stack((rho * alpha + rewards, rho * beta + (counts - rewards)))
        first_visits = float(np.count_nonzero(rows_before < 0))
        if keys:
            self.tracker.commit(keys, new_values, rows_before)
            self.num_updates += 1
        sums, count = advantages.sums, max(advantages.sums.rows, 1.0)
        metrics = {
            "spo/p_hat_mean": sums.p_hat / count,
            "spo/n_eff_mean": sums.n_eff / count,
            "spo/first_visit_ratio": first_visits / max(len(keys), 1),
            "spo/adv_before_norm_mean": advantages.mean,
            "spo/adv_std": advantages.std,
            "spo/prompts_tracked": len(self.tracker),
        }
        self.metrics = {name: float(value) for name, value in metrics.items()}

    # ------------------------------------------------------------------------------------------------ helpers
    def _beta(self, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(alpha, beta, tracker rows) of each key before this call: the tracker's, else the prior (offline or 0.5);
        a row is -1 for a prompt the tracker does not hold yet."""
        rows = self.tracker.rows_of(keys)
        prior_rows = self.priors.rows_of(keys)
        prior_alpha = self.priors.column("alpha", prior_rows, PRIOR)
        prior_beta = self.priors.column("beta", prior_rows, PRIOR)
        alpha = self.tracker.column("alpha", rows, prior_alpha)
        beta = self.tracker.column("beta", rows, prior_beta)
        return alpha, beta, rows

    @staticmethod
    def _gathered(keys: list[str], rewards: np.ndarray, counts: np.ndarray) -> tuple[list, np.ndarray, np.ndarray]:
        """Every rank's visits, merged in rank order (the same on every rank): one visit per key."""
        gathered = all_gather((keys, rewards.tolist(), counts.tolist()))
        all_keys = np.array([key for part in gathered for key in part[0]], dtype=object)
        all_rewards = np.array([value for part in gathered for value in part[1]], dtype=np.float64)
        all_counts = np.array([value for part in gathered for value in part[2]], dtype=np.float64)
        merged, (merged_rewards, merged_counts), _ = group_visits(all_keys, (all_rewards, all_counts))
        return merged, merged_rewards, merged_counts

    # ------------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Plain values and float64 tensors, safe for ``torch.save`` and ``torch.load(weights_only=True)``."""
        return {
            "format_version": STATE_FORMAT_VERSION,
            "config": self.config.to_dict(),
            "num_updates": self.num_updates,
            "tracker": self.tracker.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any], *, allow_config_change: bool = False) -> None:
        """Restore a state from :meth:`state_dict`; every check runs before anything changes."""
        saved = check_state_format(state, "SPO", STATE_FORMAT_VERSION)
        check_state_config(saved, self.config, "SPO", allow_config_change)
        num_updates = check_state_count(state, "SPO")
        tracker = state.get("tracker")
        if not isinstance(tracker, Mapping):
            raise ValueError("SPO state has no 'tracker'; it was not written by SPOEstimator.state_dict().")
        keys, values = self.tracker.validated(tracker)
        if (values <= 0).any():
            raise ValueError("SPO state holds alpha or beta <= 0: a Beta tracker's counts are positive; the file is "
                             "corrupt.")  # fmt: skip
        self.tracker.load(keys, values)
        self.num_updates = num_updates


__all__ = ["SECTION", "STATE_FORMAT_VERSION", "SPOConfig", "SPOEstimator", "offline_prior"]
