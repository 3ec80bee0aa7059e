"""Statistics across ranks: estimators that run on several ranks all-reduce what a call adds up (torch.distributed).

verl's stock trainer computes advantages in one process, where none of this runs (``should_sync`` is False); it
serves any trainer that computes advantages on several ranks, each holding whole groups.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def should_sync(enabled: bool) -> bool:
    """True when torch.distributed runs with more than one rank and syncing is on."""
    return enabled and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce(tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
    """All-reduce a CPU tensor in place, through the device that the process group's backend needs."""
    if dist.get_backend() == "nccl":
        on_device = tensor.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(on_device, op=op)
        tensor.copy_(on_device.cpu())
    else:
        dist.all_reduce(tensor, op=op)
    return tensor


def all_gather(value: Any) -> list[Any]:
    """Every rank's ``value`` (any picklable object), in rank order: for per-prompt tables keyed by strings."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


__all__ = ["all_gather", "all_reduce", "should_sync"]
