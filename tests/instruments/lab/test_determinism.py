"""Same seed, same numbers; estimators on one seed see the same prompts, uids and (at step 0) rewards."""

from __future__ import annotations

import numpy as np
import pytest

from instruments.lab.estimators import ESTIMATORS
from instruments.lab.run import RunSpec, run
from tests.instruments.lab._helpers import SMALL, traced

CURVES = ("success", "signal_ratio", "abs_advantage_max", "grad_norm", "update_norm")


@pytest.mark.parametrize("key", ["grpo", "bv_sem"])
def test_same_seed_gives_the_same_numbers(key):
    # Two runs in one process: a history left over from the first would change the second (bv_sem).
    first, second = (run(RunSpec(ESTIMATORS[key], env=SMALL, steps=15, seed=3)) for _ in range(2))
    for name in CURVES:
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))
    assert first.abs_advantage_p999 == second.abs_advantage_p999
    np.testing.assert_array_equal(first.bias.advantage, second.bias.advantage)
    other = run(RunSpec(ESTIMATORS[key], env=SMALL, steps=15, seed=4))
    assert not np.array_equal(first.success, other.success)


def test_estimators_on_one_seed_share_prompts_uids_and_random_numbers():
    grpo, bv = traced("grpo", seed=5), traced("bv_sem", seed=5)
    for a, b in zip(grpo, bv, strict=True):
        np.testing.assert_array_equal(a["prompts"], b["prompts"])
        np.testing.assert_array_equal(a["uids"], b["uids"])
    # Same policy at step 0, so the same rewards and styles; afterwards the policies differ, not the uniforms.
    np.testing.assert_array_equal(grpo[0]["rewards"], bv[0]["rewards"])
    np.testing.assert_array_equal(grpo[0]["styles"], bv[0]["styles"])
    assert len(set(grpo[0]["uids"])) == SMALL.prompts_per_step
    assert not set(grpo[0]["uids"]) & set(grpo[1]["uids"])  # one uid per prompt and step
