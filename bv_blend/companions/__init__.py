"""The BV-Blend family's other verl-free methods: the companions of the source papers (companions spec).

- :class:`HADWEstimator` (``ha_dw``): GRPO advantages reweighted by prompt difficulty against a history-aware
  anchor (arXiv 2601.08521). Stateful: the anchor history is saved with the checkpoints.
- :class:`MaxNormAC` (``maxnorm_ac``): group-relative numerators divided by their largest magnitude, floored, with
  the Reward-Resolution Protocol's binning and zero-gap skip (arXiv 2609.19164). Stateless.
- :func:`keep_mask` and friends (policy loss ``ntf``): negative token filtering, which keeps only the least likely
  tokens of negative rows in the loss (arXiv 2606.17250).

How they stack with BV-Blend (companions spec 4) is declared in each estimator's record (``bv_blend/verl/records.py``);
bounded BV-Blend is an option of BV-Blend (``bv_blend.blend``).

Like BV-Blend's core, everything here takes and returns tensors (numpy on the host inside) and never imports verl;
the glue in ``bv_blend/verl/`` registers them. docs/companions.md documents every choice.
"""

from bv_blend.companions.ha_dw import HADWConfig, HADWEstimator
from bv_blend.companions.maxnorm import MaxNormAC, MaxNormConfig, bin_rewards
from bv_blend.companions.ntf import NTFConfig, keep_counts, keep_mask, keep_weights, ntf_metrics

__all__ = [
    "HADWConfig",
    "HADWEstimator",
    "MaxNormAC",
    "MaxNormConfig",
    "NTFConfig",
    "bin_rewards",
    "keep_counts",
    "keep_mask",
    "keep_weights",
    "ntf_metrics",
]
