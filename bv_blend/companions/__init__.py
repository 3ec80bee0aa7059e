"""The BV-Blend family's other verl-free methods: the companions of the source papers (companions spec).

- :class:`HADWEstimator` (``ha_dw``): GRPO advantages reweighted by prompt difficulty against a history-aware
  anchor (arXiv 2601.08521). Stateful: the anchor history is saved with the checkpoints.
- :class:`MaxNormAC` (``maxnorm_ac``): group-relative numerators divided by their largest magnitude, floored, with
  the Reward-Resolution Protocol's binning and zero-gap skip (arXiv 2609.19164). Stateless.
- :func:`keep_mask` and friends (policy loss ``ntf``): negative token filtering, which keeps only the least likely
  tokens of negative rows in the loss (arXiv 2606.17250).
- :func:`bounded_blend_scale` and :func:`check_composition`: the sound composition with BV-Blend and the refusals.

Like BV-Blend's core, everything here takes and returns tensors (numpy on the host inside) and never imports verl;
the glue in ``bv_blend/verl/`` registers them. docs/companions.md documents every choice.
"""

from bv_blend.companions.compositions import Composition, bounded_blend_scale, check_composition
from bv_blend.companions.ha_dw import HADWConfig, HADWEstimator
from bv_blend.companions.maxnorm import MaxNormAC, MaxNormConfig, bin_rewards
from bv_blend.companions.ntf import NTFConfig, keep_counts, keep_mask, keep_weights, ntf_metrics

__all__ = [
    "Composition",
    "HADWConfig",
    "HADWEstimator",
    "MaxNormAC",
    "MaxNormConfig",
    "NTFConfig",
    "bin_rewards",
    "bounded_blend_scale",
    "check_composition",
    "keep_counts",
    "keep_mask",
    "keep_weights",
    "ntf_metrics",
]
