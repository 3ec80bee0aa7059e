"""One call's rows, as verl passes them, checked and turned into host arrays: the input layer of every estimator.

*Valid rows* (BV-Blend spec, section 2): a non-empty response mask, ``valid=True`` where a mask is given, and a uid
that does not start with ``pad`` (verl's synthetic padding rows). Invalid rows get advantage 0 and touch no
statistic, so junk in them (even NaN) is ignored. Everything here runs before an estimator changes any state, so a
bad call loses nothing; nothing here computes a statistic (``bv_blend.core.groups`` does).

The interface is torch and the arithmetic float64 numpy on the host, where verl computes advantages anyway
(docs/estimator.md, "Speed").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch

# verl's V1 trainer names the uid of each synthetic padding row f"pad{uuid4().hex}"
# (verl/trainer/ppo/padding_utils.py, upsample_batch_to_divisible_size).
PADDING_UID_PREFIX = "pad"
TOO_LARGE = "Rewards are too large: their squares or the advantages overflow. Rescale the reward."
# Rewards this far outside a declared range (relative to its width) are float noise, not a wrong range: a float32
# reward of 1 summed over token rewards can land a few ulps above 1.
RANGE_TOLERANCE = 1e-6
_FLOAT64_MAX = float(np.finfo(np.float64).max)

GroupIds = np.ndarray | torch.Tensor | Sequence[Any]
Mask = torch.Tensor | np.ndarray


class Rows(NamedTuple):
    """One call's validated rows."""

    reward: np.ndarray  # (B,) float64, 0 on invalid rows (so junk there never reaches a sum)
    valid: np.ndarray  # (B,) bool
    codes: np.ndarray  # (B,) int64 group of each row, 0..G-1 in order of first appearance
    num_groups: int  # G


def host_array(values: torch.Tensor | np.ndarray | Any) -> np.ndarray:
    """A CPU numpy array of ``values``: a view of a CPU tensor, a copy of another (bfloat16 through float32)."""
    if not isinstance(values, torch.Tensor):
        return np.asarray(values)
    values = values.detach()
    if not values.is_cpu:  # is_cpu, not .device: the cheaper attribute in a cold call (scripts/bench_ops.py)
        values = values.cpu()
    if values.dtype == torch.bfloat16:  # numpy has no bfloat16
        values = values.float()
    return values.numpy()


def bool_mask(valid: Mask) -> np.ndarray:
    """``valid`` as a host bool array; an error naming the caller's dtype if it is not bool."""
    mask = host_array(valid)
    if mask.dtype != np.bool_:
        raise ValueError(f"valid must be a bool mask, got dtype {getattr(valid, 'dtype', mask.dtype)}.")
    return mask


def check_lengths(rows: int, **arrays: np.ndarray | None) -> None:
    """Every given per-row array has ``rows`` entries along its first axis; else an error listing every length."""
    given = {name: (len(array) if np.ndim(array) else -1) for name, array in arrays.items() if array is not None}
    if any(length != rows for length in given.values()):
        raise ValueError(f"All inputs need one entry per row; got lengths {({'rewards': rows, **given})}.")


def is_padding_uid(uids: np.ndarray | Sequence[Any]) -> np.ndarray:
    """(N,) bool: which of ``uids`` name one of verl's synthetic padding rows (``pad<hex>``)."""
    uids = np.asarray(uids)
    if uids.dtype.kind not in "OUS":
        return np.zeros(uids.shape, dtype=bool)
    return np.char.startswith(uids.astype(str), PADDING_UID_PREFIX)


def factorize_groups(group_ids: GroupIds) -> tuple[np.ndarray, int, np.ndarray]:
    """Group ids (uid strings as verl passes them, or ints) as codes 0..G-1 in order of first appearance.

    ``pandas.factorize`` (a hash table) rather than ``np.unique`` (a sort, as verl's ``grpo_vectorized``): on big
    batches it is the largest single cost of a call (docs/estimator.md, "Speed").

    Returns:
        codes: (B,) int64; num_groups: G; padding: (B,) bool, the rows whose uid starts with "pad".
    """
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dtype.is_floating_point or group_ids.dtype.is_complex or group_ids.dim() != 1:
            raise TypeError(
                f"group_ids as a tensor must be 1-D integers, got dtype {group_ids.dtype} and shape "
                f"{tuple(group_ids.shape)}. Pass uid strings as a numpy object array instead."
            )
        group_ids = group_ids.cpu().numpy()
    ids = np.asarray(group_ids)
    if ids.ndim != 1:
        raise ValueError(f"group_ids must be 1-D (one id per row), got shape {ids.shape}.")
    if ids.dtype.kind in "fc":
        raise TypeError("group_ids must be strings or integers, got floats. Pass verl's uid array as it is.")
    codes, uniques = pd.factorize(ids, sort=False)
    if (codes < 0).any():  # pandas codes a missing id as -1
        row = int(np.flatnonzero(codes < 0)[0])
        raise ValueError(
            f"group_ids must not be missing: row {row} holds {ids[row]!r}. Give every row its prompt's uid."
        )
    # Test the G unique ids, not the B rows: a group has one id however many rows it has.
    return codes.astype(np.int64, copy=False), len(uniques), is_padding_uid(uniques)[codes]


def read_rows(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    valid: Mask | None = None,
    reward_range: tuple[float, float] | None = None,
    section: str = "",
    fixed_range: str | None = None,
    **per_row: np.ndarray,
) -> Rows:
    """Check one call's sequence-level inputs and turn them into host arrays.

    Args:
        rewards: (B,) float rewards.
        group_ids: (B,) prompt-group ids: uid strings (a numpy object array, as verl passes them) or ints.
        valid: optional (B,) bool; False marks padding rows, as does a uid starting with "pad".
        reward_range: the declared [lo, hi] of the rewards, if the estimator has one: the option
            ``{section}.reward_range``, or, where ``fixed_range`` says why the range is fixed, no option.
        per_row: the estimator's other per-row inputs (``cluster_ids=...``), checked for their length here.

    Raises:
        ValueError: inputs of different lengths, a non-bool ``valid``, NaN or infinite rewards on valid rows,
            rewards so large that their squares could overflow, or rewards outside ``reward_range``.
    """
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1 or not rewards.dtype.is_floating_point:
        got = f"{rewards.dtype} {tuple(rewards.shape)}" if isinstance(rewards, torch.Tensor) else type(rewards)
        raise ValueError(f"rewards must be a 1-D float tensor (one reward per row), got {got}.")
    reward = host_array(rewards).astype(np.float64)  # a copy: invalid rows are overwritten below
    rows = reward.shape[0]
    codes, num_groups, padding = factorize_groups(group_ids)
    mask = None if valid is None else bool_mask(valid)
    check_lengths(rows, group_ids=codes, **per_row, valid=mask)
    mask = ~padding if mask is None else mask & ~padding
    reward[~mask] = 0.0
    _check_reward_size(reward)
    if reward_range is not None:
        _check_reward_range(reward, mask, reward_range, section, fixed_range)
        # the float noise the check lets through is clipped off: a reward a few ulps above 1 would turn SPO's beta
        # update (rho beta + n - R) negative on that row
        reward[mask] = np.clip(reward[mask], *reward_range)
    return Rows(reward, mask, codes, num_groups)


def read_token_rows(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    valid: Mask | None = None,
    source_rows: np.ndarray | None = None,
) -> tuple[torch.Tensor, np.ndarray]:
    """verl's estimator face: the sequence rewards (sums of token rewards, as verl's GRPO) and the rows that count.

    A row counts when its response mask is not empty, ``valid`` holds for it (where given), and it is its own
    source row (where ``source_rows`` is given: verl's multi-output agent sessions, where only each session's final
    output counts; ``bv_blend.verl.multi_output``).
    """
    if token_level_rewards.shape != response_mask.shape or response_mask.dim() != 2:
        raise ValueError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be (batch, response_length)."
        )
    if response_mask.shape[1] == 0:
        raise ValueError("response_mask has no columns: a batch needs at least one response token per row.")
    counted = nonempty_rows(response_mask)
    rows = counted.shape[0]
    if valid is not None:
        mask = bool_mask(valid)
        if mask.shape != counted.shape:
            raise ValueError(f"valid has shape {mask.shape}; it needs one entry per row, {counted.shape}.")
        counted = counted & mask
    if source_rows is not None:
        source_rows = np.asarray(source_rows)
        in_range = source_rows.dtype.kind in "iu" and ((source_rows >= 0) & (source_rows < rows)).all()
        if source_rows.shape != (rows,) or not in_range:
            raise ValueError(f"source_rows must be {rows} row indices in 0..{rows - 1}, one per row.")
        counted = counted & (source_rows == np.arange(rows))
    return token_level_rewards.sum(dim=-1), counted


def token_level(
    sequence_advantages: Callable[[torch.Tensor, np.ndarray], torch.Tensor],
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    valid: Mask | None = None,
    source_rows: np.ndarray | None = None,
    on_reject: Callable[[], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator face, the same for every estimator: (B, T) rewards and mask in, ``(advantages, returns)``
    shaped like the mask (equal, as for verl's GRPO).

    ``sequence_advantages(rewards, counted)`` is the estimator's sequence face: the (B,) sums of the token rewards
    and the rows that count (:func:`read_token_rows`) in, (B,) advantages out. Each row then takes the advantage of
    its source row (``source_rows``: a multi-output session's final output, where given), broadcast over its response
    tokens. ``on_reject`` runs when the inputs are rejected, before the error propagates (an estimator that syncs
    across ranks tells the other ranks).
    """
    try:
        rewards, counted = read_token_rows(token_level_rewards, response_mask, valid, source_rows)
    except (ValueError, TypeError):
        if on_reject is not None:
            on_reject()
        raise
    sequence = sequence_advantages(rewards, counted)
    if source_rows is not None:
        sequence = sequence[torch.as_tensor(source_rows, device=sequence.device)]
    advantages = sequence.unsqueeze(-1) * response_mask
    return advantages, advantages


class GroupedTokenFace:
    """``compute_token_level`` for an estimator whose sequence face is ``compute(rewards, group_ids, valid)`` (an
    estimator that needs nothing per row but the groups)."""

    def compute(self, rewards: torch.Tensor, group_ids: GroupIds, valid: Mask | None = None) -> torch.Tensor:
        raise NotImplementedError

    def compute_token_level(
        self,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        group_ids: GroupIds,
        valid: Mask | None = None,
        source_rows: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """verl's estimator face (:func:`token_level`): (B, T) rewards and mask in, ``(advantages, returns)`` shaped
        like the mask, the sequence advantage broadcast over the response tokens; all-zero mask rows are padding."""
        return token_level(
            lambda rewards, counted: self.compute(rewards, group_ids, counted),
            token_level_rewards, response_mask, valid, source_rows,
        )  # fmt: skip


def nonempty_rows(response_mask: torch.Tensor) -> np.ndarray:
    """(B,) bool: rows with at least one response token.

    Reads the first column and, in full, only the rows that start empty. A real response starts with a model token,
    so only padding rows (verl's, or rows that rollout correction masked out) need a full scan: at 65k rows x 1,024
    tokens a full ``.any()`` costs more than the rest of the call (scripts/bench_estimator.py, docs/estimator.md).
    """
    # On the CPU (verl's case) the host array is a free view; from elsewhere only the first column is copied.
    whole = response_mask.is_cpu and response_mask.dtype != torch.bfloat16
    nonempty = host_array(response_mask if whole else response_mask[:, :1])[:, 0] != 0
    starts_empty = np.flatnonzero(~nonempty)
    if starts_empty.size:
        rows = torch.from_numpy(starts_empty).to(response_mask.device)
        nonempty[starts_empty] = host_array((response_mask[rows] != 0).any(dim=-1))
    return nonempty


def per_row_from_uids(
    index: Sequence[Any], response_mask: torch.Tensor, mapping: Any, fill: Any, dtype: Any
) -> tuple[np.ndarray, list[str]]:
    """Per-row values of a uid -> value ``mapping`` (a cluster id, a prompt key), ``fill`` where a row has none.

    Returns the values and the uids of counted rows (non-padding: a real uid and a non-empty mask) that the mapping
    lacks, for the caller's error; a padding row needs no value.
    """
    counted = (nonempty_rows(response_mask) & ~is_padding_uid(index)).tolist()
    values = np.full(len(index), fill, dtype=dtype)
    unknown = []
    for row, uid in enumerate(index):
        uid = str(uid)
        if mapping is not None and uid in mapping:
            values[row] = mapping[uid]
        elif counted[row]:
            unknown.append(uid)
    return values, unknown


def per_group(rows: Rows, values: np.ndarray, fill: Any, what: str) -> np.ndarray:
    """(G,) the value that every valid row of each group carries (``fill`` for a group without a valid row).

    Raises:
        ValueError: two valid rows of one group carry different values (one uid is one prompt: its rows share its
            cluster and its prompt key).
    """
    out = np.full(rows.num_groups, fill, dtype=values.dtype)
    out[rows.codes[rows.valid]] = values[rows.valid]
    disagrees = (out[rows.codes] != values) & rows.valid
    if disagrees.any():
        group = rows.codes[np.flatnonzero(disagrees)[0]]
        members = values[(rows.codes == group) & rows.valid]
        raise ValueError(
            f"A prompt group mixes {what} {_show(members.min())} and {_show(members.max())}: all rows of one group "
            f"(one uid) must carry their prompt's {what[:-1]}."
        )
    return out


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def to_tensor(values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """Advantages on the device of ``like``: float64 if it is float64, else float32 (so that a float16 reward's
    advantages cannot overflow)."""
    dtype = np.float64 if like.dtype == torch.float64 else np.float32
    out = torch.from_numpy(values.astype(dtype, copy=False))
    return out if like.is_cpu else out.to(like.device)


def _check_reward_size(reward: np.ndarray) -> None:
    """NaN, inf, or rewards whose squares summed over the call would overflow float64 (``not <=`` holds for NaN)."""
    bound = math.sqrt(_FLOAT64_MAX / max(reward.size, 1))
    if reward.size and not np.abs(reward).max() <= bound:
        non_finite = np.flatnonzero(~np.isfinite(reward))[:5].tolist()
        if non_finite:
            raise ValueError(f"Rewards must be finite; rows {non_finite} hold NaN or inf. Check the reward function.")
        raise ValueError(TOO_LARGE)


def _check_reward_range(
    reward: np.ndarray, valid: np.ndarray, reward_range: tuple[float, float], section: str, fixed: str | None
) -> None:
    lo, hi = reward_range
    slack = RANGE_TOLERANCE * (hi - lo)
    outside = np.flatnonzero(valid & ((reward < lo - slack) | (reward > hi + slack)))
    if not outside.size:
        return
    held = f"rows {outside[:5].tolist()} hold {reward[outside[:5]].tolist()}"
    if fixed is not None:  # a range no option moves: the reward itself must change
        raise ValueError(
            f"Rewards must lie in [{lo:g}, {hi:g}] ({fixed}); {held}. Make the reward function "
            f"(reward.custom_reward_function.path) return rewards in [{lo:g}, {hi:g}], or fix the reward."
        )
    raise ValueError(
        f"Rewards must lie in {section}.reward_range=[{lo:g}, {hi:g}]; {held}. Set {section}.reward_range to the "
        "range your reward function produces, or fix the reward."
    )


__all__ = [
    "PADDING_UID_PREFIX",
    "RANGE_TOLERANCE",
    "TOO_LARGE",
    "GroupIds",
    "GroupedTokenFace",
    "Rows",
    "bool_mask",
    "check_lengths",
    "factorize_groups",
    "host_array",
    "is_padding_uid",
    "nonempty_rows",
    "per_group",
    "read_rows",
    "read_token_rows",
    "to_tensor",
    "token_level",
]
