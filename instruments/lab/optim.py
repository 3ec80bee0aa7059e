"""The two update rules of the lab: plain SGD, and Adam with a global gradient-norm clip (verl's actor settings).

verl's FSDP actor uses AdamW (betas 0.9/0.999, eps 1e-8) with ``actor.grad_clip=1.0``, clipping the global norm
as ``torch.nn.utils.clip_grad_norm_`` does. The lab leaves out the weight decay: at verl's lr and ours it
shrinks the weights by a few percent over a run and has nothing to do with the advantage.
Both rules ascend: they return the step to add to the parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class OptimizerConfig:
    kind: str = "adam"
    lr: float = 0.01
    clip_grad_norm: float | None = 1.0  # verl's actor.grad_clip; None turns the clip off
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise ValueError(f"OptimizerConfig.kind={self.kind!r}: use one of {', '.join(OPTIMIZERS)}.")
        if not (math.isfinite(self.lr) and self.lr >= 0):
            raise ValueError(f"OptimizerConfig.lr={self.lr} must be a finite number >= 0.")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ValueError(f"OptimizerConfig.clip_grad_norm={self.clip_grad_norm} must be > 0, or None (no clip).")


class Optimizer:
    """SGD or Adam on one flat parameter vector, with an optional global gradient-norm clip before the rule."""

    def __init__(self, config: OptimizerConfig, num_params: int, lr_scale: float = 1.0) -> None:
        self.config, self.lr = config, config.lr * lr_scale
        self.step_count = 0
        self.first_moment = np.zeros(num_params)
        self.second_moment = np.zeros(num_params)

    def step(self, grad: np.ndarray) -> np.ndarray:
        """The update to add to the parameters, for the ascent direction ``grad``."""
        cfg = self.config
        if cfg.clip_grad_norm is not None:
            norm = float(np.sqrt(grad @ grad))
            grad = grad * min(1.0, cfg.clip_grad_norm / (norm + 1e-6))  # torch.nn.utils.clip_grad_norm_
        if cfg.kind == "sgd":
            return self.lr * grad
        self.step_count += 1
        self.first_moment = cfg.beta1 * self.first_moment + (1.0 - cfg.beta1) * grad
        self.second_moment = cfg.beta2 * self.second_moment + (1.0 - cfg.beta2) * grad * grad
        first = self.first_moment / (1.0 - cfg.beta1**self.step_count)
        second = self.second_moment / (1.0 - cfg.beta2**self.step_count)
        return self.lr * first / (np.sqrt(second) + cfg.eps)
