"""Hydra search-path plugin shipped with bv_blend, so that verl's stock trainer finds our configs by name:

    python -m verl.trainer.main_ppo --config-name bv_blend ...
    python -m verl.trainer.main_ppo --config-name paper/qwen25_math_7b ...

Hydra discovers every plugin in the ``hydra_plugins`` namespace package, in every hydra application of the
environment. This one appends two folders to the config search path:

- bv_blend's configs (``configs/``, shipped in the wheel as ``bv_blend/configs``);
- verl's trainer configs, which ours extend (``defaults: [ppo_trainer]``), so that a composition that does not
  start from verl's ``main_ppo`` (the paper kit, tests, ``hydra.compose``) finds them too. main_ppo has them
  already, as its primary config path.

Both are located without importing either package (nothing heavy for an unrelated hydra application), and
appended, never prepended, so an application's own configs always win over ours.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROVIDER = "bv_blend"


def package_folder(package: str, *parts: str) -> Path | None:
    """``<package's folder>/<parts...>`` if the package is installed and the folder exists; imports nothing."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)), *parts).resolve()
    return folder if folder.is_dir() else None


class BVBlendSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        present = {element.path for element in search_path.get_path()}
        ours = package_folder("bv_blend", "configs")
        if ours is not None:
            search_path.append(provider=PROVIDER, path=f"file://{ours}")
        verl = package_folder("verl", "trainer", "config")
        if verl is not None and "pkg://verl.trainer.config" not in present and f"file://{verl}" not in present:
            search_path.append(provider=PROVIDER, path=f"file://{verl}")
