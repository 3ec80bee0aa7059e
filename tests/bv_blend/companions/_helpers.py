"""Batch builders shared by the companion-method tests."""

from __future__ import annotations

import numpy as np
import torch


def groups(group_rewards: list[list[float]], prefix: str = "uid") -> tuple[torch.Tensor, np.ndarray]:
    """Rows of whole groups: float64 rewards and uid strings as verl passes them (a numpy object array)."""
    rewards, uids = [], []
    for index, group in enumerate(group_rewards):
        rewards += [float(r) for r in group]
        uids += [f"{prefix}-{index}"] * len(group)
    return torch.tensor(rewards, dtype=torch.float64), np.array(uids, dtype=object)


def token_level(rewards: torch.Tensor, length: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's layout: the sequence reward on the last response token of right-padded responses of random length."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (rewards.numel(),), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(rewards.dtype)
    token_rewards = torch.zeros(rewards.numel(), length, dtype=rewards.dtype)
    token_rewards[torch.arange(rewards.numel()), lengths - 1] = rewards
    return token_rewards, mask


def sequence(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The per-row value of token-level advantages broadcast over each row's mask (0 for empty rows)."""
    return advantages.sum(-1) / mask.sum(-1).clamp_min(1)


def with_padding(rewards: torch.Tensor, uids: np.ndarray, count: int, junk: float = float("nan")):
    """Append ``count`` padding rows the way verl's V1 trainer makes them (uid ``pad<hex>``), holding junk rewards."""
    pad_rewards = torch.full((count,), junk, dtype=rewards.dtype)
    pad_uids = np.array(["pad0123abcd"] * count, dtype=object)
    return torch.cat([rewards, pad_rewards]), np.concatenate([uids, pad_uids])
