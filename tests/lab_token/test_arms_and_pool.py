"""The arm table is consistent with the budget and the pool; an arm this installation cannot run is reported with
the reason; the training pool is fixed, held out from validation and walked in seeded epochs."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from instruments.demo.task import FAMILIES, held_out_problems
from instruments.lab.token.arms import ARMS, REFERENCE, TokenArm, bv_blend, unavailable_reason
from instruments.lab.token.pool import PromptOrder, training_pool
from instruments.lab.token.run import LabSettings
from instruments.lab.token.suites import full, quick, select


def test_the_table_fits_the_suites():
    assert next(iter(ARMS)) == REFERENCE and ARMS[REFERENCE].adv_estimator == "grpo" and ARMS[REFERENCE].n == 8
    assert len({arm.label for arm in ARMS.values()}) == len(ARMS)
    for suite in (quick({"lr": 1e-4}), full({"lr": 1e-4, "steps": 40}), select()):
        suite.settings.check(list(ARMS.values()))
    assert {arm.prompts_per_step(64) for arm in ARMS.values()} == {8, 32, 64}


def test_settings_are_checked_before_running():
    with pytest.raises(ValueError, match="not a multiple of n=3"):
        LabSettings().check([replace(ARMS["grpo8"], n=3)])
    with pytest.raises(ValueError, match="straddle"):
        LabSettings(pool_size=100).check([ARMS["grpo8"]])


@pytest.mark.parametrize("key", ["grpo8", "grpo2", "bv8", "bv2", "rpp1"])
def test_the_arms_of_the_shipped_code_run(key):
    assert unavailable_reason(ARMS[key]) is None


def test_an_unregistered_estimator_is_unavailable_with_the_reason():
    reason = unavailable_reason(TokenArm("x", "X", "no_such_estimator", n=2))
    assert "no advantage estimator 'no_such_estimator' registered" in reason


def test_rejected_options_are_unavailable_with_the_reason():
    reason = unavailable_reason(bv_blend("x", "X", n=2, no_such_option=1))
    assert reason is not None and "no_such_option" in reason


def test_which_arms_need_prompt_keys():
    needs = {key for key, arm in ARMS.items() if arm.needs_prompt_keys}
    assert needs == {"bv2_prompt", "spo1", "spo1_sampler"}


def test_bv_blend_gets_the_five_families_as_its_clusters():
    assert ARMS["bv2"].algorithm_options(len(FAMILIES)) == {"bv_blend": {"num_clusters": 5}}


def test_a_derived_arm_takes_the_winners_options():
    resolved = ARMS["bv2_best_sampler"].resolved(ARMS["bv2_prompt"])
    assert resolved.options == ARMS["bv2_prompt"].options and resolved.sampler and resolved.n == 2
    assert not resolved.best_of and resolved.key == "bv2_best_sampler"


def test_the_pool_is_fixed_even_and_held_out():
    held_out = {p.question for p in held_out_problems(120, 0)}
    pool = training_pool(320, 0, held_out)
    assert len(pool) == 320 and pool == training_pool(320, 0, held_out)
    assert Counter(p.family for p in pool) == {family: 64 for family in FAMILIES}
    assert not {p.question for p in pool} & held_out
    distinct = Counter(p.family for p in set(pool))
    assert distinct["tiny_sum"] == 26 and all(distinct[f] == 64 for f in FAMILIES if f != "tiny_sum")


def test_epochs_visit_every_prompt_once_in_the_same_order_for_every_group_size():
    streams = {}
    for k in (8, 32, 64):
        order = PromptOrder(64, seed=5)
        streams[k] = np.concatenate([order.take(k) for _ in range(2 * 64 // k)])
    assert all(np.array_equal(streams[8], s) for s in streams.values())
    first, second = streams[8][:64], streams[8][64:]
    assert sorted(first) == list(range(64)) and sorted(second) == list(range(64))
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, np.concatenate([PromptOrder(64, seed=6).take(64)]))


def test_the_regime_pool_has_no_shared_affix_so_its_codebook_is_the_commands():
    """The token lab fits the codebook on the pool's raw text (TextEncoder + fit_codebook); `bv-blend codebook`
    first strips the prefix and suffix every prompt shares. On the regime's pool there is none, so both encode the
    same texts with the same encoder, K and seed."""
    from bv_blend.codebook.encode import extract_problem_texts, find_shared_affixes
    from instruments.lab.token import run, suites

    settings = suites.regime({"lr": 1e-4, "steps": 80}).settings
    pool = run.pool_of(settings, run.held_out(settings))
    texts = [p.question for p in pool]
    assert len(set(texts)) == len(texts) == 5120
    assert find_shared_affixes(texts) == ("", "")
    stripped, prefix, suffix = extract_problem_texts([{"prompt": [{"role": "user", "content": t}]} for t in texts[:50]])
    assert (prefix, suffix) == ("", "") and stripped == texts[:50]
