"""scripts/lab_token.py rejects bad arguments before any expensive work, and the full suite runs on the frozen
settings (instruments/lab/token/frozen.json)."""

from __future__ import annotations

import pytest

from instruments.lab.token import suites
from tests._scripts import load_script


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--suite", "select", "--lr-sweep"], "--lr-sweep is for the comparison suites"),
        (["--lr-sweep", "no_such_arm"], "not an arm key"),
        (["--report-only"], "needs"),
        (["--suite", "medium"], "invalid choice"),
    ],
)
def test_bad_arguments_fail_at_once(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script("lab_token").parse_args(["--out", str(tmp_path / "never"), *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "never" / "runs").exists()


def test_the_full_suite_runs_on_the_frozen_settings():
    frozen = suites.load_frozen()
    suite = suites.full()
    assert suite.lr == frozen["lr"] and suite.settings.steps == frozen["steps"]
    assert suite.seeds == tuple(range(10)) and not set(suite.seeds) & set(frozen["selection"]["seeds"])
    assert frozen["selection"]["arm"] == "grpo8" and suite.report == "results/token_lab/lab_token.md"


def test_a_missing_frozen_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="--suite select"):
        suites.load_frozen(tmp_path / "frozen.json")
