"""scripts/fair_verdict.py, the one command of the fair verdict: --next on the repository's state and on a temporary
one; the run loop with compare_cpu and run_state faked (each run's result lands in the state as run_state's save
would put it): the state restored first, runs in the campaign's order, each saved right after it, --max-runs, a
failed run stopping it, and a run that leaves no result refused rather than run again."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from instruments import campaign, tuning
from instruments.child_run import StoppedAsAsked
from instruments.fair_verdict import REFERENCE, arm_folder, lr_folder, run_folder
from tests._scripts import load_script


def _value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


class FakeProcesses:
    """Stands in for the script's subprocess: compare_cpu "runs" (its result saved straight into the state, with a
    tuning final peaked at 2e-5), run_state is recorded; ``fail`` makes a compare_cpu call exit 1, ``lose`` exit 0
    leaving no result."""

    def __init__(self, out: Path, state: Path, fail: int | None = None, lose: bool = False):
        self.out, self.state, self.fail, self.lose = out, state, fail, lose
        self.calls: list[tuple[str, ...]] = []
        self.during_compare = lambda count: None  # what happens meanwhile, by the compare call's number

    def call(self, command: list[str], stop_when=None) -> int:
        assert command[1].endswith("scripts/compare_cpu.py")
        arm, seed, lr = _value(command, "--arms"), int(_value(command, "--seeds")), float(_value(command, "--lr"))
        steps = int(_value(command, "--steps"))
        self.calls.append(("compare", arm, f"{lr:g}", str(seed), str(steps)))
        count = len([c for c in self.calls if c[0] == "compare"])
        self.during_compare(count)
        if stop_when is not None and stop_when():  # call_child_run asks while the run runs, and stops it
            raise StoppedAsAsked(130)
        if self.fail is not None and count == self.fail:
            return 1
        if not self.lose:
            folder = Path(_value(command, "--out")).relative_to(self.out)
            path = self.state / folder / "runs" / run_folder(arm, seed) / "result.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            final = 0.7 - abs(lr - 2e-5) * 1e3
            path.write_text(json.dumps({"spec": {"seed": seed}, "settings": {"lr": str(lr), "steps": str(steps)},
                                        "validation": {"0": 0.1, str(steps): final}}))
        return 0

    def run(self, command: list[str], check: bool) -> None:
        assert command[1].endswith("scripts/run_state.py") and check
        self.calls.append(("state", command[2], str(Path(command[3]).relative_to(self.out))))


@pytest.fixture
def runner(monkeypatch, tmp_path):
    script = load_script("fair_verdict")
    monkeypatch.setattr(campaign, "committed_file", lambda path: "abc1234")

    def start(*args: str, during_compare=None, **fake) -> tuple[int, FakeProcesses]:
        processes = FakeProcesses(tmp_path / "out", tmp_path / "state", **fake)
        if during_compare is not None:
            processes.during_compare = during_compare
        monkeypatch.setattr(script, "call_child_run", processes.call)
        monkeypatch.setattr(script, "subprocess", types.SimpleNamespace(run=processes.run))
        code = script.main(["--out", str(tmp_path / "out"), "--state", str(tmp_path / "state"), *args])
        return code, processes

    start.script = script

    return start


def test_next_runs_nothing_and_names_the_first_run(runner, capsys):
    code, processes = runner("--next")
    out = capsys.readouterr().out
    assert code == 0 and processes.calls == []
    assert out.splitlines()[1].strip().startswith("1. tuning: grpo:8 lr 1e-05 seed 100 (wide, 20 steps)")
    assert "the cold start's selection: for grpo:8's tuning to choose its rate" in out
    assert "python scripts/compare_cpu.py --model smollm2" in out


def test_the_runs_go_in_order_each_saved_as_it_finishes_and_max_runs_stops(runner, tmp_path, capsys):
    code, processes = runner("--max-runs", "2")
    assert code == 0
    tuning_folder = f"lr_tuning/grpo_n8/{lr_folder(1e-5)}"
    assert processes.calls == [("compare", "grpo:8", "1e-05", "100", "20"), ("state", "save", tuning_folder),
                               ("compare", "grpo:8", "2e-05", "100", "20"),
                               ("state", "save", f"lr_tuning/grpo_n8/{lr_folder(2e-5)}")]
    assert "2 run(s) done; next: tuning: grpo:8 lr 4e-05 seed 100" in capsys.readouterr().out
    # each launch was recorded in the state before its run ran
    launched = campaign.read_launches(tmp_path / "state")
    assert [lines[0]["run"] for lines in launched.values()] == [
        "tuning: grpo:8 lr 1e-05 seed 100 (wide, 20 steps)", "tuning: grpo:8 lr 2e-05 seed 100 (wide, 20 steps)"]
    # the same command again restores the state first and goes on where it stopped
    code, processes = runner("--max-runs", "1")
    assert processes.calls[0] == ("state", "restore", "lr_tuning")
    assert [c for c in processes.calls if c[0] == "compare"] == [("compare", "grpo:8", "4e-05", "100", "20")]


def test_stop_after_current_stops_the_runner_between_runs_with_its_run_saved(runner, tmp_path, capsys):
    def ask_during_the_second(count: int) -> None:
        if count == 2:  # another shell, while the runner's second run is at work
            assert runner.script.main(["--out", str(tmp_path / "out"), "--stop-after-current"]) == 0

    code, processes = runner(during_compare=ask_during_the_second)
    assert code == 0
    compare = [c for c in processes.calls if c[0] == "compare"]
    assert [c[2] for c in compare] == ["1e-05", "2e-05"]
    assert processes.calls[-1] == ("state", "save", f"lr_tuning/grpo_n8/{lr_folder(2e-5)}")  # saved, then stopped
    out = capsys.readouterr().out
    assert "2 run(s) done, stopped as asked; next: tuning: grpo:8 lr 4e-05 seed 100" in out
    assert not runner.script.stop_request(tmp_path / "out").exists()  # asked once: the next start runs on
    code, processes = runner("--max-runs", "1")
    assert [c for c in processes.calls if c[0] == "compare"] == [("compare", "grpo:8", "4e-05", "100", "20")]


def test_a_stop_asked_of_no_runner_does_not_stop_the_next_one(runner, tmp_path):
    assert runner.script.main(["--out", str(tmp_path / "out"), "--stop-after-current"]) == 0
    assert runner.script.stop_request(tmp_path / "out").is_file()
    code, processes = runner("--max-runs", "1")
    assert code == 0 and [c[2] for c in processes.calls if c[0] == "compare"] == ["1e-05"]


def _log_steps(run_dir: Path, logged: int, checkpoints: tuple[int, ...]) -> None:
    """A run folder as verl leaves it part way: metrics lines of steps 1..logged, checkpoint folders of some steps."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, logged + 1)))
    for step in checkpoints:
        (run_dir / "checkpoints" / f"global_step_{step}").mkdir(parents=True, exist_ok=True)


def _first_run_dir(tmp_path: Path) -> Path:
    return tmp_path / "out" / "lr_tuning" / "grpo_n8" / lr_folder(1e-5) / "runs" / run_folder(REFERENCE, 100)


@pytest.mark.parametrize(("logged", "checkpoints", "stops"), [
    (10, (10,), True),  # step 10 saved and logged: it resumes there
    (10, (), False),  # nothing saved since its launch
    (9, (10,), False),  # saved inside step 10, which was never logged: it would resume from the start
    (20, (10, 20), False),  # its last step: left to finish and be saved
], ids=["saved_and_logged", "no_checkpoint", "checkpoint_not_logged", "last_step"])  # fmt: skip
def test_stop_at_checkpoint_stops_a_run_only_where_it_can_resume(runner, tmp_path, capsys, logged, checkpoints,
                                                                 stops):  # fmt: skip
    def ask_while_the_first_logs(count: int) -> None:
        if count == 1:
            _log_steps(_first_run_dir(tmp_path), logged, checkpoints)
            assert runner.script.main(["--out", str(tmp_path / "out"), "--stop-at-checkpoint"]) == 0

    code, processes = runner(during_compare=ask_while_the_first_logs)
    out = capsys.readouterr().out
    assert code == 0 and not runner.script.pause_request(tmp_path / "out").exists()
    assert [c for c in processes.calls if c[0] == "compare"] == [("compare", "grpo:8", "1e-05", "100", "20")]
    if stops:  # stopped mid-run, not saved into the state: it is not finished
        assert ("state", "save", f"lr_tuning/grpo_n8/{lr_folder(1e-5)}") not in processes.calls
        assert "0 run(s) done, stopped as asked: tuning: grpo:8 lr 1e-05 seed 100 (wide, 20 steps) stopped after " \
               "step 10" in out
    else:  # the run finished and was saved, and the runner stopped before the next
        assert processes.calls[-1] == ("state", "save", f"lr_tuning/grpo_n8/{lr_folder(1e-5)}")
        assert "1 run(s) done, stopped as asked; next: tuning: grpo:8 lr 2e-05 seed 100" in out


def test_stop_at_checkpoint_waits_for_a_step_later_than_the_run_resumed_from(runner, tmp_path, capsys):
    _log_steps(_first_run_dir(tmp_path), 10, (10,))  # an earlier attempt's: this launch resumes from step 10

    def ask(count: int) -> None:
        if count == 1:
            assert runner.script.main(["--out", str(tmp_path / "out"), "--stop-at-checkpoint"]) == 0

    code, processes = runner(during_compare=ask)
    assert code == 0 and processes.calls[-1] == ("state", "save", f"lr_tuning/grpo_n8/{lr_folder(1e-5)}")


def test_a_finished_tuning_writes_its_choice_and_the_selection_follows(runner, tmp_path):
    code, processes = runner("--max-runs", str(len(tuning.START_LRS) * 2 + 1))
    compare = [c for c in processes.calls if c[0] == "compare"]
    assert compare[-1] == ("compare", REFERENCE, "2e-05", "100", "20")  # the selection's first run, at GRPO's rate
    choice = json.loads((tmp_path / "state" / "lr_tuning" / arm_folder(REFERENCE) / "choice.json").read_text())
    assert choice["lr"] == 2e-5
    assert ("state", "save", "cold_start/selection/steps_20") in processes.calls


def test_a_failed_run_stops_the_runner_and_names_the_command_that_resumes(runner, capsys):
    code, processes = runner("--max-runs", "5", fail=2)
    err = capsys.readouterr().err
    assert code == 1 and [c[0] for c in processes.calls] == ["compare", "state", "compare"]
    assert "tuning: grpo:8 lr 2e-05 seed 100 (wide, 20 steps) failed (exit 1)" in err
    assert "Run the same command to resume it: python scripts/fair_verdict.py --out" in err


def test_a_run_that_leaves_no_result_is_not_run_again(runner, capsys):
    code, processes = runner(lose=True)
    assert code == 1 and [c[0] for c in processes.calls] == ["compare", "state"]
    assert "result.json is not there" in capsys.readouterr().err


def test_a_negative_max_runs_is_refused(runner, capsys):
    with pytest.raises(SystemExit):
        runner("--max-runs", "-1")
    assert "--max-runs must be >= 0" in capsys.readouterr().err


def test_next_on_the_repository_s_state(capsys):
    """Today GRPO's tuning is under way (or not begun): its next run comes first; later, whatever comes next."""
    assert load_script("fair_verdict").main(["--next"]) == 0
    out = capsys.readouterr().out
    grpo = tuning.next_runs(campaign.tuning_finals(campaign.ROOT / "results" / "regime" / "lr_tuning" / "grpo_n8",
                                                   REFERENCE))
    if grpo:
        lr, seed = grpo[0]
        assert out.splitlines()[1].strip().startswith(f"1. tuning: grpo:8 lr {lr:g} seed {seed}")
    assert "--out /work/runs/fair_verdict/" in out


def test_a_state_it_cannot_read_on_is_named_not_a_traceback(runner, tmp_path, capsys):
    """A selection run at another rate than GRPO's choice: the runner stops before running anything, naming it."""
    state = tmp_path / "state"
    for lr in tuning.START_LRS:
        for seed in tuning.TUNING_SEEDS:
            path = state / "lr_tuning" / "grpo_n8" / lr_folder(lr) / "runs" / run_folder(REFERENCE, seed)
            path.mkdir(parents=True)
            (path / "result.json").write_text(json.dumps({"spec": {"seed": seed}, "settings": {"lr": str(lr)},
                                                          "validation": {"20": 0.7 if lr == 2e-5 else 0.6}}))
    wrong = state / "cold_start" / "selection" / "steps_20" / "runs" / run_folder(REFERENCE, 100)
    wrong.mkdir(parents=True)
    (wrong / "result.json").write_text(json.dumps({"spec": {"seed": 100}, "settings": {"lr": "4e-05", "steps": "20"},
                                                   "validation": {"0": 0.02, "20": 0.2}}))
    code, processes = runner()
    assert code == 2 and not [c for c in processes.calls if c[0] == "compare"]
    err = capsys.readouterr().err
    assert "ran at lr 4e-05 for 20 steps; the selection runs GRPO n = 8 at its chosen rate 2e-05" in err
