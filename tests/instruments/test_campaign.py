"""The fair verdict's campaign (instruments/campaign.py): what it runs next, in which order, at which rates, read from
temporary state folders holding made-up but well-formed results (the fields it reads: spec.seed, settings.lr and
settings.steps, validation); every command it builds is one scripts/compare_cpu.py accepts; and the real
repository's state gives a sensible first run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from instruments import campaign, cold_start, fair_verdict, tuning
from instruments.campaign import COLD_STAGE, OWN_STAGE, SELECTION_STAGE, TUNING_STAGE, Run
from instruments.fair_verdict import COLD_ARMS, JUDGED_SEEDS, REFERENCE, arm_folder, lr_folder, run_folder
from tests._scripts import load_script

STEPS = campaign.wide_steps()
OUT = Path("/work/runs/fair_verdict")
CORE = ("reinforce_plus_plus:1", "bv_blend:2")


# ----------------------------------------------------------------------------------------------- the state
def save_result(regime: Path, folder: Path, arm: str, seed: int, lr: float, steps: int,
                validation: dict[str, float]) -> Path:
    """A finished run's result.json where scripts/run_state.py saves it, with the fields the campaign reads."""
    name, n = arm.split(":")
    path = regime / folder / "runs" / run_folder(arm, seed) / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"spec": {"arm": name, "n": int(n), "seed": seed},
                                "settings": {"lr": str(lr), "steps": str(steps)}, "validation": validation}))
    return path


def peaked_at(peak: float):
    return lambda lr: 0.7 - 0.1 * abs(math.log2(lr / peak))


PEAKS = {REFERENCE: 4e-5, "reinforce_plus_plus:1": 2e-5, "bv_blend:2": 1e-5, "bv_blend:8": 8e-5}


ACCEPTED_AT_20 = {20: (0.02, 0.2)}
ACCEPTED_AT_40 = {20: (0.03, 0.05), 40: (0.02, 0.2)}
NEVER = {20: (0.0, 0.0), 40: (0.0, 0.0)}


def finish(regime: Path, run: Run, cold: dict[int, tuple[float, float]]) -> None:
    """Saves a made-up result for ``run``: a tuning run's final on a curve peaked at its arm's :data:`PEAKS`, a cold
    run's start and final at its steps (``cold``)."""
    start, final = (0.1, peaked_at(PEAKS[run.arm])(run.lr)) if run.task == "wide" else cold[run.steps]
    save_result(regime, run.folder, run.arm, run.seed, run.lr, run.steps, {"0": start, str(run.steps): final})


def tune(regime: Path, arm: str, peak: float) -> float:
    """Runs an arm's tuning to its choice on a curve peaked at ``peak``; returns the choice."""
    curve = peaked_at(peak)
    finals: dict[float, dict[int, float]] = {}
    while runs := tuning.next_runs(finals):
        for lr, seed in runs:
            finals.setdefault(lr, {})[seed] = curve(lr)
            save_result(regime, campaign.TUNING / arm_folder(arm) / lr_folder(lr), arm, seed, lr, STEPS,
                        {"0": 0.1, str(STEPS): curve(lr)})
    return tuning.choose(finals).lr


def select(regime: Path, steps: int, start: float, final: float, lr: float) -> None:
    for seed in tuning.TUNING_SEEDS:
        save_result(regime, campaign.COLD_SELECTION / f"steps_{steps}", REFERENCE, seed, lr, steps,
                    {"0": start, str(steps): final})


def commit_comparison(regime: Path, arms=fair_verdict.TUNED_ARMS) -> None:
    """The committed comparison's runs at 2e-5 (seeds 0-4)."""
    for arm in arms:
        for seed in JUDGED_SEEDS:
            save_result(regime, campaign.COMMITTED, arm, seed, 2e-5, STEPS, {"0": 0.1, str(STEPS): 0.6})


def flags(command: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in zip(command, [*command[1:], ""], strict=True)
            if flag.startswith("--") and not value.startswith("--")}


@pytest.fixture(autouse=True)
def rules_commit(monkeypatch):
    """The rules' commit, which the choice and the selection name (the real one needs the rules committed)."""
    monkeypatch.setattr(campaign, "committed_file", lambda path: "abc1234")


# ---------------------------------------------------------------------------------------------- the order
def test_grpo_s_tuning_comes_first_and_everything_else_waits_on_it(tmp_path):
    p = campaign.plan(tmp_path)
    assert [(r.stage, r.arm, r.lr, r.seed) for r in p.runs[:3]] == [(TUNING_STAGE, REFERENCE, lr, 100)
                                                                    for lr in tuning.START_LRS]
    # the other arms' first tuning runs are decided too, behind it: REINFORCE++, BV-Blend n = 2, BV-Blend n = 8 last
    assert [r.arm for r in p.runs[3:]] == ["reinforce_plus_plus:1"] * 3 + ["bv_blend:2"] * 3 + ["bv_blend:8"] * 3
    assert any("selection: for grpo:8's tuning" in w for w in p.waiting)
    assert p.estimated == 6 + 2 + 6 + 6 + 15 + 30 + 6 + 5


def test_the_selection_runs_at_grpo_s_chosen_rate_before_the_other_arms_tuning(tmp_path):
    lr = tune(tmp_path, REFERENCE, 4e-5)
    p = campaign.plan(tmp_path)
    first, second = p.runs[:2]
    assert (first.stage, first.arm, first.lr, first.steps, first.task) == (SELECTION_STAGE, REFERENCE, lr, 20, "cold")
    assert [first.seed, second.seed] == [100, 101] and p.runs[2].stage == TUNING_STAGE
    command = flags(first.command(OUT))
    assert command["--lr"] == f"{lr:g}" == "4e-05" and command["--task"] == "cold" and command["--steps"] == "20"
    assert command["--test-freq"] == str(fair_verdict.COLD_TEST_FREQ) and command["--train-prompts"] == "1280"
    assert command["--out"] == str(OUT / "cold_start" / "selection" / "steps_20")
    # GRPO's judged runs at its own rate are decided now, after the other arms' tuning
    own = [r for r in p.runs if r.stage == OWN_STAGE]
    assert [(r.arm, r.seed) for r in own] == [(REFERENCE, s) for s in JUDGED_SEEDS]
    assert own[0].folder == campaign.OWN_LR / "grpo_n8" / "lr_4e-05"


def test_the_retry_at_40_steps_runs_only_when_20_fails(tmp_path):
    lr = tune(tmp_path, REFERENCE, 2e-5)
    select(tmp_path, 20, 0.03, 0.05, lr)  # not three times its start
    p = campaign.plan(tmp_path)
    retry = [r for r in p.runs if r.stage == SELECTION_STAGE]
    assert [(r.steps, r.seed) for r in retry] == [(40, 100), (40, 101)] and p.runs[:2] == tuple(retry)
    assert flags(retry[0].command(OUT))["--train-prompts"] == "2560"

    accepted = tmp_path / "accepted"
    tune(accepted, REFERENCE, 2e-5)
    select(accepted, 20, 0.03, 0.12, lr)
    p = campaign.plan(accepted)
    assert not [r for r in p.runs if r.stage == SELECTION_STAGE]
    assert any("accepted at 20 steps" in n for n in p.notes)


def test_a_selection_run_at_another_rate_than_grpo_s_is_refused(tmp_path):
    tune(tmp_path, REFERENCE, 2e-5)
    select(tmp_path, 20, 0.03, 0.12, 4e-5)
    with pytest.raises(ValueError, match="chosen rate 2e-05"):
        campaign.plan(tmp_path)


def test_a_choice_of_2e_5_reuses_the_committed_runs(tmp_path):
    commit_comparison(tmp_path)
    assert tune(tmp_path, REFERENCE, 2e-5) == 2e-5
    assert tune(tmp_path, "reinforce_plus_plus:1", 4e-5) == 4e-5
    p = campaign.plan(tmp_path)
    own = [(r.arm, r.lr, r.seed) for r in p.runs if r.stage == OWN_STAGE]
    assert own == [("reinforce_plus_plus:1", 4e-5, s) for s in JUDGED_SEEDS]  # nothing for GRPO
    assert any(n.startswith("grpo:8 chose the committed comparison's rate 2e-05: its runs there count")
               for n in p.notes)
    lines = "\n".join(campaign.describe(p, OUT, tmp_path))
    assert "its runs there count, nothing is run for it" in lines


def test_a_committed_run_missing_is_run_at_its_own_rate(tmp_path):
    commit_comparison(tmp_path, arms=())
    save_result(tmp_path, campaign.COMMITTED, REFERENCE, 0, 2e-5, STEPS, {"0": 0.1, "20": 0.6})
    tune(tmp_path, REFERENCE, 2e-5)
    own = [r for r in campaign.plan(tmp_path).runs if r.stage == OWN_STAGE]
    assert [r.seed for r in own] == [1, 2, 3, 4] and own[0].folder == campaign.OWN_LR / "grpo_n8" / "lr_2e-05"


def accepted_state(regime: Path, steps: int = 20) -> dict[str, float]:
    rates = {REFERENCE: tune(regime, REFERENCE, 4e-5), "reinforce_plus_plus:1": tune(regime, CORE[0], 8e-5),
             "bv_blend:2": tune(regime, CORE[1], 1e-5)}
    if steps == 40:
        select(regime, 20, 0.03, 0.05, rates[REFERENCE])
    select(regime, steps, 0.03, 0.12, rates[REFERENCE])
    return rates


def test_the_cold_arms_run_seed_major_each_at_its_rate(tmp_path):
    rates = accepted_state(tmp_path)
    cold = [r for r in campaign.plan(tmp_path).runs if r.stage == COLD_STAGE]
    assert [(r.seed, r.arm) for r in cold] == [(s, arm) for s in JUDGED_SEEDS for arm in COLD_ARMS]
    lr = {r.arm: r.lr for r in cold}
    assert lr["grpo:8"] == lr["grpo_dynamic:8"] == rates[REFERENCE] == 4e-5
    assert lr["bv_blend_sampler_epoch:2"] == lr["bv_blend:2"] == rates["bv_blend:2"] == 1e-5  # the same estimator
    assert lr["reinforce_plus_plus:1"] == 8e-5
    assert lr["bv_blend:8"] == rates[REFERENCE]  # tuned only last: at GRPO's in the cold start
    assert {(r.steps, r.task, r.test_freq) for r in cold} == {(20, "cold", fair_verdict.COLD_TEST_FREQ)}
    assert cold[0].folder == campaign.COLD_ARMS_STATE / "grpo_n8" / "lr_4e-05"


@pytest.mark.parametrize("steps", [20, 40])
def test_dapo_stops_at_grpo_s_rollouts(tmp_path, steps):
    accepted_state(tmp_path, steps)
    cold = [r for r in campaign.plan(tmp_path).runs if r.stage == COLD_STAGE]
    assert {r.steps for r in cold} == {steps}
    for run in cold:
        command = run.command(OUT)
        assert flags(command)["--train-prompts"] == str(64 * steps)
        if run.arm == "grpo_dynamic:8":
            assert flags(command)["--stop-at-rollouts"] == str(64 * steps) == str(run.stop_at_rollouts)
        else:
            assert "--stop-at-rollouts" not in command


def test_an_arm_s_cold_runs_keep_the_rate_they_started_at(tmp_path):
    rates = accepted_state(tmp_path)
    save_result(tmp_path, campaign.COLD_ARMS_STATE / "bv_blend_n8" / "lr_4e-05", "bv_blend:8", 0, 4e-5, 20,
                {"0": 0.02, "20": 0.2})
    tune(tmp_path, "bv_blend:8", 1e-5)  # chosen while its cold runs were under way
    cold = [r for r in campaign.plan(tmp_path).runs if r.stage == COLD_STAGE and r.arm == "bv_blend:8"]
    assert [(r.seed, r.lr) for r in cold] == [(s, rates[REFERENCE]) for s in (1, 2, 3, 4)]


def test_no_cold_start_runs_no_cold_arm(tmp_path):
    lr = tune(tmp_path, REFERENCE, 2e-5)
    select(tmp_path, 20, 0.03, 0.05, lr)
    select(tmp_path, 40, 0.03, 0.06, lr)
    tune(tmp_path, CORE[0], 2e-5)
    tune(tmp_path, CORE[1], 2e-5)
    p = campaign.plan(tmp_path)
    assert not [r for r in p.runs if r.stage in (SELECTION_STAGE, COLD_STAGE)]
    assert not [w for w in p.waiting if "cold start" in w]
    assert any(n.startswith("no cold start: its arms are not run") for n in p.notes)


# --------------------------------------------------------------------------------------- the whole campaign
def drive(regime: Path, cold: dict[int, tuple[float, float]]) -> list[Run]:
    """Runs the campaign to its end on made-up results, as the runner does (decisions written, then the first run);
    returns every run in the order it ran."""
    ran: list[Run] = []
    for _ in range(200):
        campaign.write_decisions(regime)
        p = campaign.plan(regime)
        if not p.runs:
            assert p.complete, p.waiting
            return ran
        assert p.estimated >= len(p.runs)
        ran.append(p.runs[0])
        finish(regime, p.runs[0], cold=cold)
    raise AssertionError("the campaign did not end")


STAGE_ORDER = [(TUNING_STAGE, REFERENCE), (SELECTION_STAGE, REFERENCE), (TUNING_STAGE, CORE[0]),
               (TUNING_STAGE, CORE[1]), (OWN_STAGE, None), (COLD_STAGE, None), (TUNING_STAGE, "bv_blend:8"),
               (OWN_STAGE, "bv_blend:8")]


def _stage(run: Run) -> int:
    if run.stage == OWN_STAGE:
        return STAGE_ORDER.index((OWN_STAGE, "bv_blend:8" if run.arm == "bv_blend:8" else None))
    if run.stage == COLD_STAGE:
        return STAGE_ORDER.index((COLD_STAGE, None))
    return STAGE_ORDER.index((run.stage, run.arm))


def test_the_whole_campaign_runs_in_order_and_nothing_twice(tmp_path):
    commit_comparison(tmp_path)
    ran = drive(tmp_path, ACCEPTED_AT_20)
    assert len({(r.folder, r.arm, r.seed) for r in ran}) == len(ran)  # nothing twice
    stages = [_stage(r) for r in ran]
    assert stages == sorted(stages) and set(stages) == set(range(len(STAGE_ORDER)))
    # REINFORCE++ chose the committed rate, 2e-5: its judged runs are the committed ones
    own = [(r.arm, r.lr) for r in ran if r.stage == OWN_STAGE]
    assert set(own) == {(REFERENCE, 4e-5), ("bv_blend:2", 1e-5), ("bv_blend:8", 8e-5)}
    assert [r.seed for r in ran if r.stage == OWN_STAGE and r.arm != "bv_blend:8"] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert len(own) == 15 and len([r for r in ran if r.stage == COLD_STAGE]) == len(COLD_ARMS) * len(JUDGED_SEEDS)
    assert [r.steps for r in ran if r.stage == SELECTION_STAGE] == [20, 20]
    for arm in fair_verdict.TUNED_ARMS:
        choice = json.loads((tmp_path / campaign.TUNING / arm_folder(arm) / "choice.json").read_text())
        assert choice["lr"] == PEAKS[arm] and choice["rules"] == "instruments/tuning.py at abc1234"
    selection = json.loads((tmp_path / campaign.COLD / "selection.json").read_text())
    assert selection["accepted"] and selection["steps"] == 20 and selection["lr"] == 4e-5
    assert selection["trials"]["20"]["runs"]["100"] == {"start": 0.02, "final": 0.2}
    assert selection["rule"]["source"] == "instruments/cold_start.py at abc1234"


def test_a_campaign_without_a_cold_start_ends_with_its_null(tmp_path):
    ran = drive(tmp_path, NEVER)
    assert [r.steps for r in ran if r.stage == SELECTION_STAGE] == [20, 20, 40, 40]
    assert not [r for r in ran if r.stage == COLD_STAGE]
    # nothing committed here: REINFORCE++ at 2e-5 runs its judged runs in own_lr/ too
    assert len([r for r in ran if r.stage == OWN_STAGE]) == 4 * len(JUDGED_SEEDS)
    selection = json.loads((tmp_path / campaign.COLD / "selection.json").read_text())
    assert not selection["accepted"] and selection["steps"] is None


def test_the_decisions_are_written_once(tmp_path):
    tune(tmp_path, REFERENCE, 2e-5)
    written = campaign.write_decisions(tmp_path)
    assert written == [tmp_path / campaign.TUNING / "grpo_n8" / "choice.json"]
    assert campaign.write_decisions(tmp_path) == []


# ----------------------------------------------------------------------------------- compare_cpu accepts them
@pytest.fixture(scope="module")
def compare_cpu():
    return load_script("compare_cpu")


def every_kind_of_command(regime: Path) -> list[Run]:
    """One run of each stage, steps and arm, from a campaign driven to its end (the cold start at 40 steps)."""
    ran = drive(regime, ACCEPTED_AT_40)
    kinds: dict[tuple[str, int, str], Run] = {}
    for run in ran:
        kinds.setdefault((run.stage, run.steps, run.arm), run)
    return list(kinds.values())


def _parsed(compare_cpu, run: Run):
    command = run.command(OUT)
    assert command[1].endswith("scripts/compare_cpu.py")
    a = compare_cpu.parse_args(command[2:])
    assert a.runs_only and a.distinct_train and a.dtype == "fp32" and a.model == "smollm2"
    assert (a.arms, a.seeds, a.lr, a.steps, a.task) == ([run.arm], [run.seed], run.lr, run.steps, run.task)
    assert a.pool >= a.steps * max(spec.batch for spec in a.specs)  # no prompt twice (no_revisit.check_regime's)
    return a


def test_compare_cpu_accepts_every_command_the_campaign_builds(compare_cpu, tmp_path):
    runs = [r for r in every_kind_of_command(tmp_path) if r.stop_at_rollouts is None]
    assert {(r.stage, r.steps) for r in runs} == {(TUNING_STAGE, 20), (SELECTION_STAGE, 20), (SELECTION_STAGE, 40),
                                                   (OWN_STAGE, 20), (COLD_STAGE, 40)}
    assert len(runs) == 4 + 2 + 4 + 5  # every tuned arm's tuning and own runs, the selection's, the cold arms but DAPO
    for run in runs:
        _parsed(compare_cpu, run)


def test_compare_cpu_accepts_dapo_s_stop(compare_cpu, tmp_path):
    dapo = [r for r in every_kind_of_command(tmp_path) if r.stop_at_rollouts is not None]
    assert [r.arm for r in dapo] == ["grpo_dynamic:8"]
    a = _parsed(compare_cpu, dapo[0])
    assert a.stop_at_rollouts == 64 * a.steps == 64 * 40


# ------------------------------------------------------------------------------------- the repository today
def test_the_repository_s_state_gives_a_sensible_first_run(compare_cpu):
    p = campaign.plan()
    grpo = tuning.next_runs(campaign.tuning_finals(fair_verdict.TUNING / "grpo_n8", REFERENCE))
    first = p.runs[0]
    if grpo:  # GRPO's tuning is under way: its next run comes first
        assert (first.stage, first.arm, first.lr, first.seed) == (TUNING_STAGE, REFERENCE, *grpo[0])
        assert any("selection: for grpo:8's tuning" in w for w in p.waiting)
    else:
        assert (first.stage, first.arm) != (TUNING_STAGE, REFERENCE)
    _parsed(compare_cpu, first)
    assert flags(first.command(Path("/x")))["--out"].startswith("/x/")


def test_the_selection_s_plan_is_the_design_s(tmp_path):
    assert fair_verdict.COLD_STEPS == (20, 40) and cold_start.START_MAX == 0.05 and cold_start.GAIN == 3


# ------------------------------------------------------------------------------------------------ launches
def test_a_launch_is_recorded_with_its_run_commit_and_cpu(tmp_path):
    run = Run(TUNING_STAGE, REFERENCE, 1e-5, 100, STEPS, "wide", fair_verdict.WIDE_TEST_FREQ,
              campaign.TUNING / arm_folder(REFERENCE) / lr_folder(1e-5))
    first, second = campaign.record_launch(tmp_path, run), campaign.record_launch(tmp_path, run)
    result = f"lr_tuning/grpo_n8/lr_1e-05/runs/grpo_n8_seed100/{campaign.RESULT}"
    assert first["result"] == result and first["run"] == run.describe()
    assert len(first["commit"]) == 40 and isinstance(first["tree_clean"], bool)  # this checkout's, read at launch
    assert first["cpu"].startswith("CPU: ")
    assert campaign.read_launches(tmp_path) == {result: [first, second]}  # appended, each line strict JSON
    assert len((tmp_path / campaign.LAUNCHES).read_text().splitlines()) == 2


def test_a_launch_record_it_cannot_read_is_named_with_its_fix(tmp_path):
    (tmp_path / campaign.LAUNCHES).write_text('{"result": "a", "launched_utc": "2026-12-06T07:00:00+00:00"}\n{"res\n')
    with pytest.raises(ValueError, match=r"launches.jsonl, line 2, is not a launch record.*git checkout"):
        campaign.read_launches(tmp_path)


def _launch(time: str) -> dict:
    return {"result": "r", "launched_utc": f"2026-12-06T{time}:00+00:00"}


def test_a_launch_after_which_no_attempt_started_was_lost():
    launches = [_launch("07:00"), _launch("08:00"), _launch("09:00")]
    # the 07:00 launch's attempt was lost with its machine; 08:00 started one, and 09:00 resumed it
    starts = ["2026-12-06T08:01:30+00:00", "2026-12-06T09:02:00+00:00"]
    assert campaign.launches_without_attempt(launches, starts) == [launches[0]]
    assert campaign.launches_without_attempt(launches, [*starts, "2026-12-06T07:01:00+00:00"]) == []
    # a result whose attempts' starts are not kept cannot tell which launch was lost: it names none
    assert campaign.launches_without_attempt(launches, [None]) == []
    assert campaign.launches_without_attempt([], starts) == []
