"""BV-Blend: uncertainty-weighted historical baselines for critic-free RL with verifiable rewards.

The estimators load (with torch) on first use of their names, so that ``bv-blend --help`` and the verl plugin's
entry module, which import this package first, pay nothing for them.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "BVBlendConfig": "bv_blend.blend.config",
    "BVBlendEstimator": "bv_blend.blend.estimator",
    "SPOConfig": "bv_blend.spo",
    "SPOEstimator": "bv_blend.spo",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [*_LAZY]
__version__ = "0.1.0"
