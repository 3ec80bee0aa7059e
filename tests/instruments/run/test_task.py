"""The demo's task: the held-out split shares no prompt with training, on the parquet files verl reads."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from instruments.run.task import FAMILIES, assert_disjoint, held_out_problems, make_problems, read_questions, write_task


def test_held_out_problems_are_distinct_balanced_and_reproducible():
    val = held_out_problems(120, seed=0)
    assert len({p.question for p in val}) == 120
    counts = pd.Series([p.family for p in val]).value_counts()
    assert set(counts.index) == set(FAMILIES) and set(counts) == {24}
    assert [p.question for p in val] == [p.question for p in held_out_problems(120, seed=0)]
    assert [p.question for p in val] != [p.question for p in held_out_problems(120, seed=1)]
    # families interleave, so the first rows cover every family
    assert [p.family for p in val[:5]] == list(FAMILIES)


def test_held_out_refuses_to_take_more_than_half_of_a_family():
    # sums of 0-4 have 2 wordings x 25 pairs = 50 distinct prompts: 26 of them would leave training fewer than half
    with pytest.raises(ValueError, match="tiny_sum.*only 50.*at most 125"):
        held_out_problems(130, seed=0)


def test_make_problems_never_draws_an_excluded_question():
    held_out = {p.question for p in held_out_problems(125, seed=3)}  # half of the smallest family
    drawn = make_problems(3000, seed=4, exclude=held_out)
    assert not {p.question for p in drawn} & held_out
    assert {p.family for p in drawn} == set(FAMILIES)


def test_make_problems_refuses_to_exclude_a_whole_family():
    everything = {p.question for p in FAMILIES["tiny_sum"].space()}
    with pytest.raises(ValueError, match="every prompt of family 'tiny_sum' is excluded"):
        make_problems(10, seed=0, exclude=everything)


def test_write_task_files_are_disjoint_and_name_each_family_as_its_data_source(tmp_path):
    train, val = write_task(tmp_path, n_train=2000, n_val=120, seed=0, per_family_sources=True)
    train_q, val_q = read_questions(train), read_questions(val)
    assert len(train_q) == 2000 and len(val_q) == len(set(val_q)) == 120
    assert_disjoint(train_q, val_q)
    assert not set(train_q) & set(val_q)
    frame = pd.read_parquet(val)
    families = [info["family"] for info in frame["extra_info"]]
    assert list(frame["data_source"]) == families
    assert all(info["question"] == q for info, q in zip(frame["extra_info"], val_q, strict=True))


def test_write_task_keeps_verl_gsm8k_source_by_default(tmp_path):
    train, _ = write_task(tmp_path, n_train=20, n_val=16, seed=0)
    assert set(pd.read_parquet(train)["data_source"]) == {"openai/gsm8k"}


def test_assert_disjoint_names_a_shared_prompt():
    with pytest.raises(AssertionError, match=r"1 validation prompts are also training prompts, e.g. 'Add 1 and 2.'"):
        assert_disjoint(["Add 1 and 2.", "Add 2 and 2."], ["Add 1 and 2.", "Add 3 and 3."])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_problem_index_enumerates_each_distinct_problem_once(family):
    space = FAMILIES[family].space()
    assert len(space) == FAMILIES[family].size == len({p.question for p in space})
    f = FAMILIES[family]
    for p in space[:: max(1, len(space) // 50)]:
        operands = [int(x) for x in re.findall(r"\d+", p.question)] + [f.b_range[0]]  # echo has no b
        assert p.answer == f.answer(operands[0], operands[1]) and p.target == f"#### {p.answer}"


def test_the_wide_task_gives_a_no_revisit_pool_disjoint_from_its_held_out_split():
    from instruments.run.task import WIDE_FAMILIES, distinct_problems

    held_out = {p.question for p in held_out_problems(120, seed=0, task="wide")}
    pool = distinct_problems(5120, seed=0, exclude=held_out, task="wide")
    assert len({p.question for p in pool}) == 5120  # no prompt twice: the regime's 80 steps x 64 prompts
    assert not held_out & {p.question for p in pool}
    assert pd.Series([p.family for p in pool]).value_counts().to_dict() == {f: 1024 for f in WIDE_FAMILIES}
    assert not set(WIDE_FAMILIES) & set(FAMILIES)  # its own family names: no report mixes the two tasks


def test_a_pool_larger_than_a_family_is_a_clear_error():
    from instruments.run.task import distinct_problems

    with pytest.raises(ValueError, match="family 'echo' of task 'demo' has 176 problems outside the held-out split"):
        distinct_problems(5120, seed=0, exclude={p.question for p in held_out_problems(120, seed=0)})


def test_the_cold_task_is_the_wide_families_that_start_near_zero_with_a_pool_for_its_runs():
    """results/fair_verdict.md, section 3: plus_digit, times_12 and sum_2digit, as the wide task has them; 40
    held-out prompts a family and a pool of 64 x 40 distinct problems (the 40-step fallback) disjoint from them."""
    from instruments.run.task import TASKS, WIDE_FAMILIES, distinct_problems

    assert list(TASKS["cold"]) == ["plus_digit", "times_12", "sum_2digit"]
    assert all(TASKS["cold"][name] is WIDE_FAMILIES[name] for name in TASKS["cold"])
    held_out = {p.question for p in held_out_problems(120, seed=0, task="cold")}
    pool = distinct_problems(64 * 40, seed=0, exclude=held_out, task="cold")
    questions = {p.question for p in pool}
    assert len(held_out) == 120 and len(questions) == 64 * 40 and not held_out & questions
    assert {p.family for p in pool} == set(TASKS["cold"])
