"""`BVBlendConfig`: the estimator's parameters, their defaults and their validation.

The names and defaults follow ``docs/estimator.md`` (section 5 of the spec). Values the paper does not
state (``temperature``, ``n0``, ``v_prior``, ``delta_n``, and the stability options ``variance_floor`` and
``max_abs_advantage`` of spec 5 step 8) are our documented choices. ``variance_floor="none"`` with
``max_abs_advantage=None`` is the paper's method exactly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

WEIGHT_MODES = ("sem", "fixed", "neff", "sigma")
VARIANCE_FLOORS = ("prior", "none")
AUTO = "auto"
# Options added after states were first saved, with the value that reproduces how such a state was computed:
# before variance_floor existed, no floor was applied.
ADDED_OPTIONS: dict[str, Any] = {"variance_floor": "none", "bounded_scale_tau": None}


@dataclass(frozen=True)
class BVBlendConfig:
    """Parameters of the BV-Blend estimator.

    Attributes:
        gamma: EMA decay of the per-cluster moments, in (0, 1]. The paper uses 0.9.
        epsilon: added to the blended scale before dividing, as verl's GRPO does (1e-6).
        temperature: T in the confidence weight w = exp(-SEM / T).
        n0: effective sample size given to a cluster at its first sighting (cold start).
        v_prior: variance assumed at a cluster's first sighting; 0.25 is the largest a 0/1 reward can have.
        delta_n: floor on the effective sample size inside the SEM, so a young cluster is not over-trusted.
        weight_mode: ``sem`` (the method), or the ablations ``fixed``, ``neff`` and ``sigma``.
        fixed_weight: the weight of mode ``fixed`` (paper ablation: 0.5).
        max_abs_advantage: clip of the sequence advantage: ``"auto"`` (default) clips each group at
            max(5, (n_g - 1) / sqrt(n_g)), which never changes a group without history; a positive number clips
            every row at it; ``None`` is no clip (the paper).
        variance_floor: ``"prior"`` (default): the historical variance is at least V_prior / max(N_k, delta_N)
            wherever it is used; ``"none"``: v_k = m2 - m1^2 as in the paper.
        bounded_scale_tau: ``None`` (default): the blended scale s_g as the paper has it. A number tau >= 0: bounded
            BV-Blend (companions spec section 4), s_g = max(s_g, max_i |R_i - b_g|, tau), so |A| <= 1 and the
            ratios within a group are kept; it shrinks GRPO's large values (1 right of 8: 2.47 -> 1), so retune
            the learning rate.
        sync_across_ranks: all-reduce the per-call sufficient statistics when torch.distributed runs
            with more than one rank.
    """

    gamma: float = 0.9
    epsilon: float = 1e-6
    temperature: float = 0.1
    n0: float = 1.0
    v_prior: float = 0.25
    delta_n: float = 1.0
    weight_mode: str = "sem"
    fixed_weight: float = 0.5
    max_abs_advantage: float | str | None = AUTO
    variance_floor: str = "prior"
    bounded_scale_tau: float | None = None
    sync_across_ranks: bool = True

    def __post_init__(self) -> None:
        for name in ("gamma", "epsilon", "temperature", "n0", "v_prior", "delta_n", "fixed_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"BVBlendConfig.{name} must be a finite number, got {value!r}.")
        _require(0.0 < self.gamma <= 1.0, "gamma", self.gamma, "must be in (0, 1]: it is the EMA decay per call")
        _require(self.epsilon > 0.0, "epsilon", self.epsilon, "must be > 0 (a zero-variance group divides by it)")
        _require(self.temperature > 0.0, "temperature", self.temperature, "must be > 0: w = exp(-SEM / T)")
        _require(self.n0 > 0.0, "n0", self.n0, "must be > 0: it is a cluster's sample size at first sighting")
        _require(self.v_prior >= 0.0, "v_prior", self.v_prior, "must be >= 0: it is a variance")
        _require(self.delta_n > 0.0, "delta_n", self.delta_n, "must be > 0: it floors the N inside the SEM")
        _require(
            self.weight_mode in WEIGHT_MODES,
            "weight_mode",
            self.weight_mode,
            f"must be one of {', '.join(WEIGHT_MODES)}",
        )
        _require(0.0 <= self.fixed_weight <= 1.0, "fixed_weight", self.fixed_weight, "must be in [0, 1]")
        if self.max_abs_advantage not in (None, AUTO):
            value = self.max_abs_advantage
            ok = not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0 and math.isfinite(value)
            _require(ok, "max_abs_advantage", value, "must be 'auto', a finite number > 0, or None for no clip")
        _require(
            self.variance_floor in VARIANCE_FLOORS,
            "variance_floor",
            self.variance_floor,
            f"must be one of {', '.join(VARIANCE_FLOORS)}",
        )
        if self.bounded_scale_tau is not None:
            value = self.bounded_scale_tau
            ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
            _require(ok, "bounded_scale_tau", value, "must be a finite number >= 0, or None for the unbounded scale")
        _require(
            isinstance(self.sync_across_ranks, bool), "sync_across_ranks", self.sync_across_ranks, "must be a bool"
        )

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> BVBlendConfig:
        """Build from a dict or an OmegaConf node, rejecting unknown keys by name.

        Keys that are not estimator parameters (the verl glue's own options) must be removed by the caller.
        """
        options = dict(options or {})
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"Unknown BV-Blend option(s) {unknown}. Known options: {sorted(known)}. Check the spelling "
                "of algorithm.bv_blend.* in your config."
            )
        return cls(**options)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def options_as_saved(saved: Mapping[str, Any] | None) -> dict[str, Any]:
    """A saved config's options, with every option it predates set to the value it was computed with."""
    saved = dict(saved or {})
    return {**{name: value for name, value in ADDED_OPTIONS.items() if name not in saved}, **saved}


def predates(saved: Mapping[str, Any] | None) -> list[str]:
    """The options a saved config was written before (empty for a config of this version)."""
    return [name for name in ADDED_OPTIONS if name not in (saved or {})]


def config_mismatch(
    saved: Mapping[str, Any] | None, current: Mapping[str, Any], spell: Callable[[str, Any], str]
) -> str | None:
    """``None`` when a saved state's options equal ``current``; else the end of an error message that names each
    change and the options that continue the state exactly as it was computed (``spell(name, value)`` writes one
    option in the caller's syntax: Python keywords, hydra overrides)."""
    as_saved = options_as_saved(saved)
    changed = config_changes(as_saved, current)
    if not changed:
        return None
    note = ""
    if older := [name for name in predates(saved) if name in changed]:
        computed = ", ".join(f"{name}={as_saved[name]!r}" for name in older)
        note = (
            f" The state was saved before the option(s) {older} existed, so it was computed with {computed}"
            " (the paper's literal formulas when max_abs_advantage is None too)."
        )
    restore = " ".join(spell(name, values[0]) for name, values in changed.items())
    return f"another config (saved, current): {changed}.{note} To continue it exactly as it was computed, set {restore}"


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{option: (saved, current)}`` for every option whose value differs; an absent option reads as ``None``."""
    return {
        name: (saved.get(name), current.get(name))
        for name in sorted(set(saved) | set(current))
        if saved.get(name) != current.get(name)
    }


def _require(condition: bool, name: str, value: Any, why: str) -> None:
    if not condition:
        raise ValueError(f"BVBlendConfig.{name}={value!r} is invalid: it {why}.")
