"""The session's shared CPU assets (tests/e2e/_assets.py): built once, used by every run of verl's trainer."""

from __future__ import annotations

import pytest

from tests.e2e._assets import CpuAssets, build_cpu_assets


@pytest.fixture(scope="session")
def cpu_assets(tmp_path_factory: pytest.TempPathFactory) -> CpuAssets:
    return build_cpu_assets(tmp_path_factory.mktemp("cpu_e2e"))
