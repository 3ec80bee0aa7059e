"""HA-DW: history-aware adaptive difficulty weighting (arXiv 2601.08521), companions spec section 2.

One call, over valid rows (section numbers are the spec's "Per call" steps):

    (1) A^_i   = (R_i - p^_g) / (std_g + eps)          verl's ``grpo``; Dr.GRPO mode: R_i - p^_g
    (2) a      = the anchor: mean of the stored batch accuracies (``window``) or C- (``kalman``);
                 ``with_current`` reads it after this call's update; nothing stored yet: a = y_t
    (3) diff_g = (p^_g - a) / (r_hi - r_lo)
    (4) D_i    = -sgn(A^_i) sgn(diff_g),   A_i = lambda exp(D_i |diff_g|) A^_i
    (5) singletons keep ``grpo``'s value (Phi = 1); zero-variance groups stay 0
    (7) y_t    = mean R over valid rows, folded into the anchor state after the advantages

The anchor state is a short 1-D history, owned by :class:`HADWEstimator` like a torchmetrics ``Metric``'s state:
``window`` keeps the last h batch accuracies y; ``kalman`` keeps the last m posteriors C+ (the newest is C- of the
next call, and the population std of the kept ones sets the gain). No Python loop runs over rows or groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bv_blend.core.groups import GroupStats, group_stats, grpo_advantages
from bv_blend.core.options import (
    OptionsMixin,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_state_config,
    check_state_count,
    check_state_format,
    require,
    reward_range,
)
from bv_blend.core.rows import RANGE_TOLERANCE, GroupedTokenFace, GroupIds, Rows, read_rows, to_tensor

MODES = ("window", "kalman")
ANCHORS = ("prior", "with_current")
STATE_FORMAT_VERSION = 1
SECTION = "algorithm.ha_dw"


@dataclass(frozen=True)
class HADWConfig(OptionsMixin):
    """Parameters of HA-DW; defaults are the companions spec's (docs/companions.md says where each comes from).

    Attributes:
        lambda_scale: lambda in Phi = lambda exp(D |diff|); 1.3 is the paper's best (Table 7).
        mode: ``window`` (hard anchor: mean of the last ``window`` batch accuracies, the official code) or
            ``kalman`` (soft anchor C+ = (1 - eta_t) C- + eta_t y_t, paper Eq. 7-11).
        window: h, the batch accuracies the ``window`` anchor averages (official code: 10).
        eta: eta in the ``kalman`` gain eta_t = clip(eta sigma, eta_min, 1).
        eta_min: the floor of that gain; without it the literal Eq. 8-11 freeze (sigma = 0 gives eta_t = 0).
        belief_window: m, the posteriors C+ whose population std is sigma (``kalman``).
        anchor: ``prior`` (history of earlier calls only, paper Eq. 13) or ``with_current`` (this call's
            accuracy folded in first, as the official code does).
        reward_range: [lo, hi] of the sequence reward; diff is divided by hi - lo, and a reward outside is an error.
        norm_adv_by_std: True for GRPO's standardised A^, False for Dr.GRPO's R - p^ (verl's
            ``algorithm.norm_adv_by_std_in_grpo``).
        epsilon: verl's GRPO epsilon.
    """

    SECTION = SECTION

    lambda_scale: float = 1.3
    mode: str = "window"
    window: int = 10
    eta: float = 1.0
    eta_min: float = 0.05
    belief_window: int = 10
    anchor: str = "prior"
    reward_range: tuple[float, float] = (0.0, 1.0)
    norm_adv_by_std: bool = True
    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("lambda_scale", "eta", "eta_min", "epsilon"):
            check_number(SECTION, name, getattr(self, name))
        require(self.lambda_scale > 0, SECTION, "lambda_scale", self.lambda_scale, "must be > 0: it scales Phi")
        check_choice(SECTION, "mode", self.mode, MODES)
        check_int(SECTION, "window", self.window, 1)
        require(self.eta >= 0, SECTION, "eta", self.eta, "must be >= 0: the gain is eta * sigma")
        require(0 <= self.eta_min <= 1, SECTION, "eta_min", self.eta_min, "must be in [0, 1]: it floors a gain")
        check_int(SECTION, "belief_window", self.belief_window, 1)
        check_choice(SECTION, "anchor", self.anchor, ANCHORS)
        object.__setattr__(self, "reward_range", reward_range(SECTION, self.reward_range))
        check_bool(SECTION, "norm_adv_by_std", self.norm_adv_by_std)
        require(self.epsilon >= 0, SECTION, "epsilon", self.epsilon, "must be >= 0")

    @property
    def capacity(self) -> int:
        """How many values the anchor history keeps: h (``window``) or m (``kalman``)."""
        return self.window if self.mode == "window" else self.belief_window


class HADWEstimator(GroupedTokenFace):
    """GRPO (or Dr.GRPO) advantages reweighted by prompt difficulty against a history-aware anchor.

    Args:
        config: the parameters; defaults to ``HADWConfig()``.

    After each call, :attr:`metrics` holds the call's ``ha_dw/*`` metrics.
    """

    def __init__(self, config: HADWConfig | None = None) -> None:
        self.config = config if config is not None else HADWConfig()
        if not isinstance(self.config, HADWConfig):
            raise TypeError(f"config must be a HADWConfig, got {type(self.config).__name__}.")
        # window: the last h batch accuracies y; kalman: the last m posteriors C+ (history[-1] is C-).
        self.history = np.zeros(0)
        self.num_updates = 0
        self.metrics: dict[str, float] = {}

    @property
    def anchor(self) -> float | None:
        """The anchor the next call would use with ``anchor=prior``; ``None`` before any call."""
        return None if self.history.size == 0 else self._read_anchor(self.history)

    # ------------------------------------------------------------------------------------------------ faces
    def compute(
        self, rewards: torch.Tensor, group_ids: GroupIds, valid: torch.Tensor | np.ndarray | None = None
    ) -> torch.Tensor:
        """Sequence-level advantages, one per row, then fold the call's batch accuracy into the anchor.

        Args:
            rewards: (B,) float rewards R_i.
            group_ids: (B,) prompt-group ids: uid strings (a numpy object array, as verl passes them) or ints.
            valid: optional (B,) bool; False marks padding rows, as does a uid starting with "pad".

        Returns:
            (B,) advantages on the device of ``rewards`` (float64 for float64 rewards, else float32).

        Raises:
            ValueError: NaN or infinite rewards, rewards outside ``reward_range``, or inputs of different lengths.
                The anchor state and the metrics are left exactly as they were.
        """
        rows = read_rows(rewards, group_ids, valid, self.config.reward_range, SECTION)
        advantage = self._weight_and_update(rows, group_stats(rows))
        return to_tensor(advantage, rewards)

    # ------------------------------------------------------------------------------------------------- math
    def _weight_and_update(self, rows: Rows, groups: GroupStats) -> np.ndarray:
        cfg = self.config
        num_valid = float(groups.count.sum())
        if num_valid == 0:  # nothing to learn from and nothing to fold: the state does not move
            self.metrics = self._idle_metrics()
            return np.zeros(rows.reward.shape[0])

        # (1) The algorithm's own advantage: verl's grpo / Dr.GRPO arithmetic.
        base = grpo_advantages(rows, groups, cfg.norm_adv_by_std, cfg.epsilon)

        # (7) The call's batch accuracy and the history it leads to (committed only at the end).
        batch_accuracy = float(groups.total.sum()) / num_valid
        new_history, gain = self._updated_history(batch_accuracy)

        # (2) Anchor: from earlier calls only (prior), or after this call's update (with_current).
        if cfg.anchor == "with_current":
            anchor = self._read_anchor(new_history)
        else:
            anchor = self._read_anchor(self.history) if self.history.size else batch_accuracy

        # (3, 4) Difficulty of each group against the anchor, and the weight Phi of each row.
        lo, hi = cfg.reward_range
        difficulty = (groups.mean - anchor) / (hi - lo)
        row_difficulty = difficulty[rows.codes]
        direction = -np.sign(base) * np.sign(row_difficulty)  # D_i, with sgn(0) = 0
        phi = cfg.lambda_scale * np.exp(direction * np.abs(row_difficulty))
        # (5) Singletons are outside the theory (it needs G >= 2): Phi = 1, they keep grpo's value.
        weighted = rows.valid & (groups.count[rows.codes] >= 2)
        phi = np.where(weighted, phi, 1.0)
        advantage = phi * base

        self.metrics = self._metrics(
            groups, advantage, phi, weighted & (base != 0), difficulty, anchor, batch_accuracy, gain
        )
        self.history, self.num_updates = new_history, self.num_updates + 1
        return advantage

    def _updated_history(self, batch_accuracy: float) -> tuple[np.ndarray, float | None]:
        """The anchor history after folding in y_t, and the kalman gain eta_t (``None`` in window mode)."""
        cfg, history = self.config, self.history
        if cfg.mode == "window":
            return np.append(history, batch_accuracy)[-cfg.window :], None
        # Kalman: C- is the last posterior (the first call sets C- = y_1); sigma is the population std of the
        # stored posteriors, 0 with fewer than two. eta_min keeps the anchor from freezing when sigma = 0.
        prior = history[-1] if history.size else batch_accuracy
        sigma = float(history.std()) if history.size >= 2 else 0.0
        gain = min(max(cfg.eta * sigma, cfg.eta_min), 1.0)
        posterior = (1.0 - gain) * prior + gain * batch_accuracy
        return np.append(history, posterior)[-cfg.belief_window :], gain

    def _read_anchor(self, history: np.ndarray) -> float:
        """The anchor a history gives: the mean of the stored y (window) or the newest C+ (kalman)."""
        return float(history.mean()) if self.config.mode == "window" else float(history[-1])

    # ---------------------------------------------------------------------------------------------- metrics
    def _metrics(
        self,
        stats: GroupStats,
        advantage: np.ndarray,
        phi: np.ndarray,
        reweighted: np.ndarray,
        difficulty: np.ndarray,
        anchor: float,
        batch_accuracy: float,
        gain: float | None,
    ) -> dict[str, float]:
        groups = stats.count >= 2  # the groups HA-DW weighs
        num_groups = max(int(np.count_nonzero(groups)), 1)
        # Phi over the rows it actually scales (A^ != 0); 1.0, the identity, when it scaled none.
        phi_used = phi[reweighted] if np.count_nonzero(reweighted) else np.ones(1)
        metrics = {
            "ha_dw/anchor": anchor,
            "ha_dw/batch_acc": batch_accuracy,
            "ha_dw/phi_mean": float(phi_used.mean()),
            "ha_dw/phi_min": float(phi_used.min()),
            "ha_dw/phi_max": float(phi_used.max()),
            "ha_dw/hard_group_ratio": np.count_nonzero(groups & (difficulty < 0)) / num_groups,
            "ha_dw/easy_group_ratio": np.count_nonzero(groups & (difficulty > 0)) / num_groups,
            "ha_dw/abs_advantage_max": float(np.abs(advantage).max()),
        }
        if gain is not None:  # window mode has no gain to report
            metrics["ha_dw/eta"] = gain
        return {name: float(value) for name, value in metrics.items()}  # numpy scalars become plain floats

    def _idle_metrics(self) -> dict[str, float]:
        """Metrics of a call without valid rows: the anchor as it stands (0 before any call), no signal."""
        metrics = {
            "ha_dw/anchor": self.anchor if self.anchor is not None else 0.0,
            "ha_dw/batch_acc": 0.0,
            "ha_dw/phi_mean": 1.0,
            "ha_dw/phi_min": 1.0,
            "ha_dw/phi_max": 1.0,
            "ha_dw/hard_group_ratio": 0.0,
            "ha_dw/easy_group_ratio": 0.0,
            "ha_dw/abs_advantage_max": 0.0,
        }
        if self.config.mode == "kalman":
            metrics["ha_dw/eta"] = 0.0
        return metrics

    # ------------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Plain values and one float64 tensor, safe for ``torch.save`` and ``torch.load(weights_only=True)``."""
        return {
            "format_version": STATE_FORMAT_VERSION,
            "config": self.config.to_dict(),
            "num_updates": self.num_updates,
            "history": torch.from_numpy(self.history.copy()),
        }

    def load_state_dict(self, state: Mapping[str, Any], *, allow_config_change: bool = False) -> None:
        """Restore a state from :meth:`state_dict`; every check runs before anything changes.

        Args:
            allow_config_change: keep this estimator's options even if the state was saved under others (the mode
                must still match: a window of accuracies is not a series of posteriors). A history longer than the
                new capacity keeps its newest values.
        """
        saved = HADWConfig.from_mapping(check_state_format(state, "HA-DW", STATE_FORMAT_VERSION))
        if saved.mode != self.config.mode:
            raise ValueError(
                f"The saved HA-DW state is a {saved.mode!r} history but this estimator runs mode "
                f"{self.config.mode!r}: the two keep different quantities. Resume with {SECTION}.mode={saved.mode}."
            )
        check_state_config(saved.to_dict(), self.config, "HA-DW", allow_config_change)
        num_updates = check_state_count(state, "HA-DW")
        history = state.get("history")
        if not isinstance(history, torch.Tensor) or history.dim() != 1 or not history.dtype.is_floating_point:
            got = f"{history.dtype} {tuple(history.shape)}" if isinstance(history, torch.Tensor) else history
            raise ValueError(f"HA-DW state 'history' must be a 1-D float tensor, got {got!r}.")
        values = history.detach().to("cpu", torch.float64).numpy().copy()
        lo, hi = saved.reward_range
        slack = RANGE_TOLERANCE * (hi - lo)  # the inputs' tolerance: an accuracy can sit that far outside
        if not np.isfinite(values).all() or np.count_nonzero((values < lo - slack) | (values > hi + slack)):
            raise ValueError(
                f"HA-DW state 'history' holds values outside its reward range [{lo:g}, {hi:g}] (or NaN): the file "
                "is corrupt."
            )
        if values.size > saved.capacity:
            raise ValueError(
                f"HA-DW state 'history' holds {values.size} values, more than its {saved.mode} capacity "
                f"{saved.capacity}: the file is corrupt."
            )
        self.history, self.num_updates = values[-self.config.capacity :], num_updates


__all__ = ["ANCHORS", "MODES", "STATE_FORMAT_VERSION", "HADWConfig", "HADWEstimator"]
