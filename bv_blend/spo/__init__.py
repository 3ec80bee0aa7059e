"""SPO (arXiv 2509.13232): a per-prompt Beta tracker of the success rate as the baseline, verl-free."""

from bv_blend.spo.estimator import SPOConfig, SPOEstimator

__all__ = ["SPOConfig", "SPOEstimator"]
