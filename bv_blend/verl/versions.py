"""Installed versions of bv_blend and verl, for error messages, state files and the doctor (imports nothing heavy)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

SUPPORTED_VERL = ">=0.9.1,<0.10"


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (e.g. ``"verl"``, ``"bv-blend"``), or ``None`` if it is not."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None
