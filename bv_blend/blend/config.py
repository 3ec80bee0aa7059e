"""`BVBlendConfig`: the estimator's parameters, their defaults and their validation.

The names and defaults follow ``docs/estimator.md`` (section 5 of the spec). Values the paper does not
state (``temperature``, ``n0``, ``v_prior``, ``delta_n``, and the stability options ``variance_floor`` and
``max_abs_advantage`` of spec 5 step 8) are our documented choices. ``variance_floor="none"`` with
``max_abs_advantage=None`` is the paper's method exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from bv_blend.core.options import OptionsMixin, check_bool, check_choice, check_number, is_number, require

SECTION = "algorithm.bv_blend"
WEIGHT_MODES = ("sem", "fixed", "neff", "sigma")
VARIANCE_FLOORS = ("prior", "none")
HISTORY_LEVELS = ("cluster", "prompt", "prompt_and_cluster")
AUTO = "auto"


@dataclass(frozen=True)
class BVBlendConfig(OptionsMixin):
    """Parameters of the BV-Blend estimator (``algorithm.bv_blend.*`` in a verl config).

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
        history_level: whose history the baseline blends in (history_spec 3): ``cluster`` (the paper), ``prompt``
            (each prompt's own moments; no codebook), or ``prompt_and_cluster`` (the prompt's blended over the
            cluster's).
        prompt_decay: rho_p, the decay of a prompt's moments per visit (never per call: a prompt comes back about once
            an epoch); 0.875 is SPO's constant.
        n0_prior: the effective sample size that offline prior scores are worth, at most (history_spec 4): a prompt
            with N prior scores starts at N_p = min(N, n0_prior), a cluster at N_k = n0_prior.
    """

    SECTION = SECTION

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
    history_level: str = "cluster"
    prompt_decay: float = 0.875
    n0_prior: float = 4.0

    def __post_init__(self) -> None:
        for name in ("gamma", "epsilon", "temperature", "n0", "v_prior", "delta_n", "fixed_weight"):
            check_number(SECTION, name, getattr(self, name))
        require(0.0 < self.gamma <= 1.0, SECTION, "gamma", self.gamma, "must be in (0, 1]: the EMA decay per call")
        require(self.epsilon > 0.0, SECTION, "epsilon", self.epsilon, "must be > 0: zero-variance groups divide by it")
        require(self.temperature > 0.0, SECTION, "temperature", self.temperature, "must be > 0: w = exp(-SEM / T)")
        require(self.n0 > 0.0, SECTION, "n0", self.n0, "must be > 0: it is a cluster's sample size at first sighting")
        require(self.v_prior >= 0.0, SECTION, "v_prior", self.v_prior, "must be >= 0: it is a variance")
        require(self.delta_n > 0.0, SECTION, "delta_n", self.delta_n, "must be > 0: it floors the N inside the SEM")
        check_choice(SECTION, "weight_mode", self.weight_mode, WEIGHT_MODES)
        require(0.0 <= self.fixed_weight <= 1.0, SECTION, "fixed_weight", self.fixed_weight, "must be in [0, 1]")
        if self.max_abs_advantage not in (None, AUTO):
            value = self.max_abs_advantage
            ok = is_number(value) and value > 0
            require(ok, SECTION, "max_abs_advantage", value, "must be 'auto', a finite number > 0, or None for no clip")
        check_choice(SECTION, "variance_floor", self.variance_floor, VARIANCE_FLOORS)
        if self.bounded_scale_tau is not None:
            value = self.bounded_scale_tau
            ok = is_number(value) and value >= 0
            why = "must be a finite number >= 0, or None for the unbounded scale"
            require(ok, SECTION, "bounded_scale_tau", value, why)
        check_bool(SECTION, "sync_across_ranks", self.sync_across_ranks)
        check_choice(SECTION, "history_level", self.history_level, HISTORY_LEVELS)
        check_number(SECTION, "prompt_decay", self.prompt_decay)
        require(0.0 < self.prompt_decay <= 1.0, SECTION, "prompt_decay", self.prompt_decay,
                "must be in (0, 1]: the decay per visit")  # fmt: skip
        check_number(SECTION, "n0_prior", self.n0_prior)
        require(self.n0_prior > 0.0, SECTION, "n0_prior", self.n0_prior, "must be > 0: prior scores count as samples")

    @property
    def uses_prompts(self) -> bool:
        return self.history_level != "cluster"

    @property
    def uses_clusters(self) -> bool:
        return self.history_level != "prompt"


__all__ = ["AUTO", "HISTORY_LEVELS", "SECTION", "VARIANCE_FLOORS", "WEIGHT_MODES", "BVBlendConfig"]
