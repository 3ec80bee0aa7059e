"""Each test starts with no BV-Blend session, so histories never leak between tests."""

import pytest

from bv_blend.verl import runtime


@pytest.fixture(autouse=True)
def fresh_runtime():
    runtime.reset()
    yield
    runtime.reset()
