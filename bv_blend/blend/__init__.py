"""BV-Blend's math, verl-free: the config, the per-cluster moments, one call's sums and the estimator."""

from bv_blend.blend.config import BVBlendConfig
from bv_blend.blend.estimator import BVBlendEstimator

__all__ = ["BVBlendConfig", "BVBlendEstimator"]
