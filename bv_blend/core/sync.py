"""Statistics across ranks: estimators that run on several ranks all-reduce what a call adds up (torch.distributed).

verl's stock trainer computes advantages in one process, where none of this runs (``should_sync`` is False); it
serves any trainer that computes advantages on several ranks, each holding whole groups.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

Sums = TypeVar("Sums", bound="Reduced")


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


class Reduced:
    """A dataclass of what one call adds up, each field declaring how ranks combine it: by sum (the default) or by
    max (``field(metadata={"reduce": "max"})``), like a torchmetrics ``Metric`` state. Fields are floats or float
    arrays (summed element-wise).

    :meth:`all_reduce` packs the summed fields, in their order, into one SUM all-reduce and the max fields into one
    MAX all-reduce, so a new sum is one new field and nothing else to keep in step.
    """

    @classmethod
    def reduced_by(cls, reduce: str) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.metadata.get("reduce", "sum") == reduce]  # type: ignore[arg-type]

    def all_reduce(self: Sums) -> Sums:
        """The global batch's sums (every rank gets the same)."""
        summed, maxed = self.reduced_by("sum"), self.reduced_by("max")
        values = [np.asarray(getattr(self, name), dtype=np.float64) for name in summed]
        packed = all_reduce(torch.from_numpy(np.concatenate([value.ravel() for value in values]))).numpy()
        out: dict[str, Any] = {}
        start = 0
        for name, value in zip(summed, values, strict=True):
            part = packed[start : start + value.size]
            out[name] = part.reshape(value.shape) if value.ndim else float(part[0])
            start += value.size
        if maxed:
            peaks = torch.tensor([float(getattr(self, name)) for name in maxed], dtype=torch.float64)
            out.update(zip(maxed, all_reduce(peaks, op=dist.ReduceOp.MAX).tolist(), strict=True))
        return type(self)(**out)


def all_gather(value: Any) -> list[Any]:
    """Every rank's ``value`` (any picklable object), in rank order: for per-prompt tables keyed by strings."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


__all__ = ["Reduced", "all_gather", "all_reduce", "should_sync"]
