"""The wheel ships what an installation needs beyond the code: the configs verl finds by name, the hydra plugin
that lets it find them, and the reward module the paper configs name (built with setuptools from a copy of the
checkout's files, ~3 s; nothing is installed)."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from tests._wheel import build_wheel

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> set[str]:
    return set(zipfile.ZipFile(build_wheel(tmp_path_factory.mktemp("wheel"))).namelist())


def test_wheel_ships_the_hydra_plugin_as_a_namespace_package(wheel_names):
    assert "hydra_plugins/bv_blend_searchpath/bv_blend_searchpath.py" in wheel_names
    assert "hydra_plugins/__init__.py" not in wheel_names  # a namespace package: other plugins share it


def test_wheel_ships_every_config_and_the_reward_module(wheel_names):
    configs = {p.relative_to(ROOT / "configs").as_posix() for p in (ROOT / "configs").rglob("*.yaml")}
    assert configs and {f"bv_blend/configs/{name}" for name in configs} <= wheel_names
    assert "bv_blend/paper/rewards.py" in wheel_names


def test_wheel_holds_no_instrument(wheel_names):
    """The labs, the demo, the CPU platform and their statistics and machine description stay in the checkout
    (instruments/), at their new place or the old one inside the package."""
    assert "bv_blend/verl/plugin.py" in wheel_names and "bv_blend/blend/estimator.py" in wheel_names
    assert (ROOT / "instruments" / "cpu" / "__init__.py").is_file()  # the build's source had them
    old = ("bv_blend/cpu/", "bv_blend/demo/", "bv_blend/lab/", "bv_blend/stats.py", "bv_blend/machine.py")
    shipped = sorted(n for n in wheel_names if n.startswith(("instruments/", *old)))
    assert not shipped, f"instrument files in the wheel: {shipped}"


def test_a_missing_extra_is_named_in_the_error(monkeypatch):
    """Without the codebook extra (its packages hidden from import here), the error says what to install."""
    import numpy as np

    from bv_blend.codebook import TextEncoder, fit_codebook

    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    monkeypatch.setitem(sys.modules, "sklearn.cluster", None)
    with pytest.raises(ImportError, match=r"pip install 'bv-blend\[codebook\]'"):
        TextEncoder()
    with pytest.raises(ImportError, match=r"pip install 'bv-blend\[codebook\]'"):
        fit_codebook(np.eye(3, dtype=np.float32), 2, encoder_id="e")
