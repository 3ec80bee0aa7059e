"""Validation helpers shared by every estimator's frozen config (BV-Blend, SPO, HA-DW, MaxNorm-AC, NTF).

Each config names its verl section (``algorithm.bv_blend`` ...) in :attr:`OptionsMixin.SECTION`, so that every error
says which option of the user's config is wrong and what would be right.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

Options = TypeVar("Options", bound="OptionsMixin")


class OptionsMixin:
    """``from_mapping`` (unknown keys are errors, by name) and ``to_dict`` for a frozen dataclass config."""

    SECTION: ClassVar[str] = ""  # where the options live in a verl config, e.g. "algorithm.ha_dw"

    @classmethod
    def from_mapping(cls: type[Options], options: Mapping[str, Any] | None) -> Options:
        """Build from a dict or an OmegaConf node converted to one; a misspelt key is an error, not a default."""
        options = dict(options or {})
        known = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"Unknown option(s) {cls.SECTION}.{{{', '.join(unknown)}}}. Known options: {sorted(known)}. "
                "Check the spelling."
            )
        return cls(**options)

    def to_dict(self) -> dict[str, Any]:
        """Plain values only (tuples become lists), so the dict round-trips through OmegaConf and torch.save."""
        return {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in dataclasses.asdict(self).items()  # type: ignore[call-overload]
        }


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{option: (saved, current)}`` for every option whose value differs; an absent option reads as ``None``."""
    return {
        name: (saved.get(name), current.get(name))
        for name in sorted(set(saved) | set(current))
        if saved.get(name) != current.get(name)
    }


def config_mismatch(
    saved: Mapping[str, Any] | None, current: Mapping[str, Any], spell: Callable[[str, Any], str]
) -> str | None:
    """``None`` when a saved state's options equal ``current``; else the end of an error message that names each
    change and the options that continue the state exactly as it was computed (``spell(name, value)`` writes one
    option in the caller's syntax: Python keywords, hydra overrides)."""
    changed = config_changes(dict(saved or {}), current)
    if not changed:
        return None
    restore = " ".join(spell(name, values[0]) for name, values in changed.items())
    return f"another config (saved, current): {changed}. To continue it exactly as it was computed, set {restore}"


def check_state_format(state: Any, label: str, version: int) -> Mapping[str, Any]:
    """A saved estimator state of this version's format, with its config; a clear error otherwise."""
    if not isinstance(state, Mapping) or state.get("format_version") != version:
        found = state.get("format_version") if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"Unsupported {label} state format {found!r}; this version reads format {version} only.")
    if not isinstance(state.get("config"), Mapping):
        raise ValueError(f"{label} state has no 'config'; it was not written by the estimator's state_dict().")
    return state["config"]


def check_state_config(saved: Mapping[str, Any], current: OptionsMixin, label: str, allow_change: bool) -> None:
    """The options a state was computed with are valid and equal the current ones (unless ``allow_change``)."""
    type(current).from_mapping(saved)  # valid options, or the config's own clear error
    mismatch = config_mismatch(saved, current.to_dict(), lambda name, value: f"{name}={value!r}")
    if mismatch and not allow_change:
        raise ValueError(
            f"The saved {label} state was made with {mismatch} in {type(current).__name__}, or pass "
            "allow_config_change=True to continue its history under the current options."
        )


def check_state_count(state: Mapping[str, Any], label: str, name: str = "num_updates") -> int:
    value = state.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{label} state {name!r} must be a non-negative int, got {value!r}.")
    return value


def require(condition: bool, section: str, name: str, value: Any, why: str) -> None:
    if not condition:
        raise ValueError(f"{section}.{name}={value!r} is invalid: it {why}.")


def is_number(value: Any) -> bool:
    """A finite int or float (bools are not numbers here)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def check_number(section: str, name: str, value: Any) -> None:
    require(is_number(value), section, name, value, "must be a finite number")


def check_int(section: str, name: str, value: Any, minimum: int) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int) and value >= minimum
    require(ok, section, name, value, f"must be an int >= {minimum}")


def check_choice(section: str, name: str, value: Any, choices: Sequence[str]) -> None:
    require(value in choices, section, name, value, f"must be one of {', '.join(choices)}")


def check_bool(section: str, name: str, value: Any) -> None:
    require(isinstance(value, bool), section, name, value, "must be true or false")


def check_optional_text(section: str, name: str, value: Any) -> None:
    """``None``, or a non-empty string (a path, a field name)."""
    ok = value is None or (isinstance(value, str) and bool(value))
    require(ok, section, name, value, "must be a non-empty string or null")


def reward_range(section: str, value: Any) -> tuple[float, float]:
    """``[lo, hi]`` as a tuple of floats with lo < hi, both finite; an OmegaConf ListConfig works too."""
    try:
        lo, hi = value
    except (TypeError, ValueError):
        lo = hi = None
    ok = is_number(lo) and is_number(hi) and lo < hi
    require(ok, section, "reward_range", value, "must be [lo, hi] with finite lo < hi (the reward's declared range)")
    return float(lo), float(hi)


__all__ = [
    "OptionsMixin",
    "check_bool",
    "check_choice",
    "check_int",
    "check_optional_text",
    "check_number",
    "check_state_config",
    "check_state_count",
    "check_state_format",
    "config_changes",
    "config_mismatch",
    "is_number",
    "require",
    "reward_range",
]
