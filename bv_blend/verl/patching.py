"""Wrap one verl attribute, after checking that it still looks the way bv_blend was written against.

Every wrapper is installed at most once (re-importing the plugin, or two import routes, never double-wraps),
and a target that a future verl removed or re-signed is reported loudly instead of being patched blindly.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from bv_blend.verl import runtime
from bv_blend.verl.versions import SUPPORTED_VERL, installed_version

_MARK = "__bv_blend_wrapped__"


def verl_version() -> str:
    return installed_version("verl") or "unknown"


def wrap(owner: Any, name: str, expected_params: Sequence[str], make_wrapper: Callable[[Callable], Callable]) -> bool:
    """Replace ``owner.name`` by ``make_wrapper(original)``; returns whether the hook is in place.

    Args:
        owner: a module or a class.
        name: the attribute (function or method).
        expected_params: the leading parameter names the wrapper relies on (e.g. ``("self", "batch", "metrics")``).
        make_wrapper: builds the wrapper from the original.
    """
    where = f"{getattr(owner, '__module__', '')}.{getattr(owner, '__qualname__', getattr(owner, '__name__', owner))}"
    original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if original is None:
        runtime.report_hook_error(
            f"verl {verl_version()}: {where}.{name} does not exist; bv_blend supports verl{SUPPORTED_VERL}."
        )
        return False
    if getattr(original, _MARK, False):
        return True
    params = list(inspect.signature(original).parameters)
    if params[: len(expected_params)] != list(expected_params):
        runtime.report_hook_error(
            f"verl {verl_version()}: {where}.{name}{inspect.signature(original)} no longer starts with "
            f"({', '.join(expected_params)}); bv_blend supports verl{SUPPORTED_VERL}."
        )
        return False
    wrapper = functools.wraps(original)(make_wrapper(original))
    setattr(wrapper, _MARK, True)
    setattr(owner, name, wrapper)
    return True


def is_wrapped(owner: Any, name: str) -> bool:
    return bool(getattr(getattr(owner, name, None), _MARK, False))
