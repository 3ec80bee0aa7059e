"""Cross-rank sync: 2 and 4 real gloo processes on CPU, each holding whole groups, agree with one process.

Every rank must end with the same state, and each row's advantage must equal the one a single process
computes on the whole batch (spec section 8). Metrics are global: every rank reports the whole batch's. One spawn per
world size runs every case of that size (tests/_distributed_worker.py: ``run_cases``); the tests read what each
case's ranks saved.
"""

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from bv_blend import BVBlendConfig, BVBlendEstimator
from tests._distributed_worker import (
    NUM_CLUSTERS,
    call_options,
    make_calls,
    prompt_keys_of,
    run_cases,
    run_rank,
    run_rank_with_a_bad_call,
    run_spo_rank,
    spo_calls,
)

# one worker builds the module's ranks once (scripts/test.sh: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("gloo_ranks")

MATCH_CASES = [(2, True, False), (4, True, False), (2, False, False), (4, False, False), (4, True, True)]
MATCH_SEED, BAD_CALL_SEED, SPO_SEED = 7, 11, 5
HISTORY_LEVELS = ["cluster", "prompt_and_cluster"]


def match_case(world_size: int, binary: bool, never_varies: bool) -> str:
    return f"match_{world_size}_{binary}_{never_varies}"


@pytest.fixture(scope="module")
def ranks_saved(tmp_path_factory) -> Path:
    """Every case's ranks, one ``mp.spawn`` per world size; each case saves ``<case>/rank<r>.pt``."""
    out = tmp_path_factory.mktemp("gloo_ranks")

    def case(run, name: str, *args) -> tuple:
        (out / name).mkdir()
        return run, str(out / name), args

    for world_size in (2, 4):
        cases = [case(run_rank, match_case(*c), MATCH_SEED, *c[1:]) for c in MATCH_CASES if c[0] == world_size]
        if world_size == 2:
            cases += [case(run_rank_with_a_bad_call, f"bad_call_{level}", BAD_CALL_SEED, level)
                      for level in HISTORY_LEVELS]  # fmt: skip
            cases.append(case(run_spo_rank, "spo", SPO_SEED))
        mp.spawn(run_cases, args=(world_size, str(out / f"init{world_size}"), cases), nprocs=world_size, join=True)
    return out


def saved_ranks(folder: Path, world_size: int) -> list:
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


def single_process(seed: int, binary: bool, never_varies: bool = False):
    estimator = BVBlendEstimator(NUM_CLUSTERS, BVBlendConfig(temperature=0.5))
    results = []
    for rewards, uids, clusters, _ in make_calls(seed, **call_options(binary, never_varies)):
        results.append({"advantages": estimator.compute(rewards, uids, clusters), "metrics": dict(estimator.metrics)})
    return estimator.state_dict(), results


@pytest.mark.slow
@pytest.mark.parametrize(("world_size", "binary", "never_varies"), MATCH_CASES)
def test_ranks_with_whole_groups_match_one_process(ranks_saved, world_size, binary, never_varies):
    """With the defaults on; ``never_varies`` makes the variance floor and the auto clip act: both are functions
    of the synced state and of each (whole) group, so every rank gets the single process's numbers."""
    expected_state, expected = single_process(MATCH_SEED, binary, never_varies)
    if never_varies:  # the stability options did act in this run
        assert max(result["metrics"]["bv_blend/variance_floor_active_ratio"] for result in expected) > 0
        assert expected[-1]["metrics"]["bv_blend/abs_advantage_max"] == pytest.approx(5.0)
    # 0/1 rewards sum exactly in any order; real rewards agree up to rounding of the cross-rank sum.
    tolerance = {"rtol": 0, "atol": 0} if binary else {"rtol": 1e-12, "atol": 1e-12}

    saved_by_rank = saved_ranks(ranks_saved / match_case(world_size, binary, never_varies), world_size)
    if world_size == 4:  # call 1 has two groups: some rank held no row at all and still synced
        assert any(len(saved["results"][1]["rows"]) == 0 for saved in saved_by_rank)
    for saved in saved_by_rank:
        for name in ("count", "mean", "second_moment"):
            torch.testing.assert_close(saved["state"][name], expected_state[name], **tolerance)
        assert torch.equal(saved["state"]["seen"], expected_state["seen"])
        assert saved["state"]["num_updates"] == expected_state["num_updates"]
        for call, result in enumerate(saved["results"]):
            torch.testing.assert_close(
                result["advantages"], expected[call]["advantages"][result["rows"]], rtol=1e-6, atol=1e-6
            )
            assert result["metrics"] == pytest.approx(expected[call]["metrics"], rel=1e-9, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("history_level", HISTORY_LEVELS)
def test_a_rejected_input_on_one_rank_raises_on_every_rank_and_changes_no_state(ranks_saved, history_level):
    """Without the failure flag in the all-reduce, rank 0 would wait for rank 1 until gloo's timeout; at the prompt
    levels rank 0 must raise before the prompt table's gather, which rank 1 never joins."""
    saved = saved_ranks(ranks_saved / f"bad_call_{history_level}", 2)
    assert saved[1]["errors"][1].startswith("Rewards must be finite")
    assert saved[0]["errors"][1].startswith("Another rank's input for this call was rejected")
    assert [saved[rank]["errors"][call] for rank in range(2) for call in (0, 2)] == [None] * 4

    # The failed call changed nothing on either rank, and the next call synced as if it had not happened.
    calls = make_calls(BAD_CALL_SEED, num_calls=3)
    reference = BVBlendEstimator(NUM_CLUSTERS, BVBlendConfig(temperature=0.5, history_level=history_level))
    for call in (0, 2):
        rewards, uids, clusters, _ = calls[call]
        reference.compute(rewards, uids, clusters, prompt_keys=prompt_keys_of(uids))
    for rank in range(2):
        states = saved[rank]["states"]
        for name in ("count", "mean", "second_moment", "seen"):
            assert torch.equal(states[1][name], states[0][name]), name
            assert torch.equal(states[2][name], reference.state_dict()[name]), name
        if history_level != "cluster":  # the prompt table too: unchanged by the failed call, then as one process's
            assert states[0]["prompts"]["keys"] and prompt_table(states[1]) == prompt_table(states[0])
            after, expected = prompt_table(states[2]), prompt_table(reference.state_dict())
            assert after.keys() == expected.keys()
            for key, values in expected.items():
                torch.testing.assert_close(torch.tensor(after[key]), torch.tensor(values), rtol=1e-12, atol=1e-12)


def prompt_table(state: dict) -> dict[str, list[float]]:
    table = state["prompts"]
    columns = [name for name in table if name != "keys"]
    return {key: [float(table[name][i]) for name in columns] for i, key in enumerate(table["keys"])}


def by_key(spo_state: dict) -> dict[str, tuple[float, float]]:
    tracker = spo_state["tracker"]
    values = zip(tracker["alpha"].tolist(), tracker["beta"].tolist(), strict=True)
    return dict(zip(tracker["keys"], values, strict=True))


@pytest.mark.slow
def test_spo_ranks_match_one_process_and_a_rejection_reaches_every_rank(ranks_saved):
    """SPO's declared sums (the batch normalisation's) are all-reduced and its visits gathered: every rank gets the
    single process's advantages, metrics and tracker; a reward out of [0, 1] on one rank raises on both, and
    changes neither tracker."""
    from bv_blend import SPOEstimator

    saved = saved_ranks(ranks_saved / "spo", 2)
    reference, calls = SPOEstimator(), spo_calls(SPO_SEED)
    for call, (rewards, uids, keys, _) in enumerate(calls[:-1]):
        expected = reference.compute(rewards, uids, keys)
        for rank in range(2):
            result = saved[rank][call]
            assert result["error"] is None
            torch.testing.assert_close(result["advantages"], expected[result["rows"]], rtol=1e-6, atol=1e-6)
            assert result["metrics"] == pytest.approx(reference.metrics, rel=1e-9, abs=1e-12)
            assert by_key(result["state"]) == by_key(reference.state_dict())  # rows in rank order: compare by key
    last = [saved[rank][-1] for rank in range(2)]
    assert last[1]["error"].startswith("Rewards must lie in [0, 1]")
    assert last[0]["error"].startswith("Another rank's input for this call was rejected")
    for rank in range(2):
        assert by_key(last[rank]["state"]) == by_key(saved[rank][-2]["state"])
