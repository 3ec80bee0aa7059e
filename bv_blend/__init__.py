"""BV-Blend: uncertainty-weighted historical baselines for critic-free RL with verifiable rewards."""

from bv_blend.blend.config import BVBlendConfig
from bv_blend.blend.estimator import BVBlendEstimator

__all__ = ["BVBlendConfig", "BVBlendEstimator"]
__version__ = "0.1.0"
