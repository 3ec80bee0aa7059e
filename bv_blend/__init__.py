"""BV-Blend: uncertainty-weighted historical baselines for critic-free RL with verifiable rewards."""

from bv_blend.blend.config import BVBlendConfig
from bv_blend.blend.estimator import BVBlendEstimator
from bv_blend.spo import SPOConfig, SPOEstimator

__all__ = ["BVBlendConfig", "BVBlendEstimator", "SPOConfig", "SPOEstimator"]
__version__ = "0.1.0"
