"""The training-dynamics report on small synthetic logs written by verl's own loggers (file and tensorboard)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bv_blend.paper.report import PANELS, load_run, plot_dynamics, read_jsonl_log, summarise
from tests._scripts import load_script

STEPS = 30


def _bv_blend_metrics(step: int) -> dict[str, float]:
    return {
        "critic/score/mean": 0.2 + 0.4 * step / STEPS,
        "bv_blend/effective_signal_ratio": 0.9,
        "bv_blend/grpo_signal_ratio": 0.5 + 0.01 * step,
        "response_length/mean": 600.0 + 10 * step,
        "actor/entropy": 0.5 - 0.01 * step,
        "bv_blend/weight_mean": min(1.0, 0.03 * step),
        "timing_s/step": 12.5,
    }


def _grpo_metrics(step: int) -> dict[str, float]:
    return {"critic/score/mean": 0.2 + 0.3 * step / STEPS, "response_length/mean": 600.0, "actor/entropy": 0.45}


def _write_with_verl(monkeypatch, tmp_path, name: str, metrics_of, backends: list[str]):
    """Log STEPS steps through verl's Tracking, as the trainer does, into <tmp>/<name>/{metrics.jsonl,tensorboard}."""
    from verl.utils.tracking import Tracking

    run_dir = tmp_path / name
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(run_dir / "metrics.jsonl"))
    monkeypatch.setenv("TENSORBOARD_DIR", str(run_dir / "tensorboard"))
    run_dir.mkdir()
    tracking = Tracking(project_name="test", experiment_name=name, default_backend=backends)
    for step in range(1, STEPS + 1):
        tracking.log(metrics_of(step), step=step)
    tracking.finish()
    return run_dir


@pytest.fixture
def runs(monkeypatch, tmp_path):
    return {
        "bv_blend": _write_with_verl(monkeypatch, tmp_path, "bv", _bv_blend_metrics, ["file", "tensorboard"]),
        "grpo": _write_with_verl(monkeypatch, tmp_path, "grpo", _grpo_metrics, ["file"]),
    }


def test_jsonl_and_tensorboard_logs_read_back_the_same(runs):
    from_jsonl = read_jsonl_log(runs["bv_blend"] / "metrics.jsonl")
    from_tensorboard = load_run(runs["bv_blend"] / "tensorboard")
    assert list(from_jsonl.index) == list(range(1, STEPS + 1))
    for key in _bv_blend_metrics(1):
        np.testing.assert_allclose(from_tensorboard[key].to_numpy(), from_jsonl[key].to_numpy(), rtol=1e-6)
    assert from_jsonl.loc[STEPS, "critic/score/mean"] == pytest.approx(0.6)


def test_plot_dynamics_writes_every_panel_as_png(runs, tmp_path):
    import matplotlib.image

    frames = {name: load_run(path) for name, path in runs.items()}
    written, notes = plot_dynamics(frames, tmp_path / "fig", smooth=3)
    assert sorted(p.name for p in written) == sorted(panel.filename for panel in PANELS)
    for path in written:
        pixels = matplotlib.image.imread(path)
        assert pixels.shape[0] > 300 and pixels.std() > 0.05  # a drawn figure, not a blank canvas
    # GRPO's run logs no bv_blend/* metrics: said, not silently dropped.
    assert any("'grpo' has no bv_blend/effective_signal_ratio" in note for note in notes)
    assert any("'grpo' has no bv_blend/weight_mean" in note for note in notes)


def test_panel_without_data_is_skipped_with_a_note(runs, tmp_path):
    written, notes = plot_dynamics({"grpo": load_run(runs["grpo"])}, tmp_path / "fig")
    assert "weight_mean.png" not in {p.name for p in written} and "reward.png" in {p.name for p in written}
    assert any("weight_mean.png: no run logged" in note for note in notes)


def test_summary_averages_the_last_steps(runs):
    table = summarise({name: load_run(path) for name, path in runs.items()}, last=10)
    assert table.loc["bv_blend", "bv_blend/effective_signal_ratio"] == pytest.approx(0.9)
    assert table.loc["grpo", "critic/score/mean"] == pytest.approx(np.mean([0.2 + 0.3 * s / STEPS for s in
                                                                            range(21, 31)]))
    assert math.isnan(table.loc["grpo", "bv_blend/weight_mean"])


def test_bad_inputs_name_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1, "data": {"a": 1}}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_jsonl_log(bad)
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        load_run(tmp_path)


def test_plot_dynamics_script_end_to_end(runs, tmp_path, capsys):
    script = load_script("plot_dynamics")
    out = tmp_path / "figs"
    argv = ["--run", f"bv_blend={runs['bv_blend']}", "--run", f"grpo={runs['grpo']}", "--out", str(out)]
    assert script.main(argv) == 0
    assert len(list(out.glob("*.png"))) == len(PANELS)
    assert "wrote" in capsys.readouterr().out
    assert script.main(["--run", "nameonly", "--out", str(out)]) == 2


def test_a_resumed_run_keeps_both_attempts_metrics(monkeypatch, tmp_path):
    """verl's file logger opens its file with "wb": each launch of scripts/train.py gets its own file
    (``launch.metrics_file``), and load_run reads them in order, the later attempt winning a step both logged."""
    from verl.utils.tracking import Tracking

    from bv_blend.paper.launch import metrics_file

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for steps, score in ((range(1, 4), 0.1), (range(3, 6), 0.9)):  # the second attempt resumes from step 2's save
        path = metrics_file(run_dir)
        monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
        tracking = Tracking(project_name="test", experiment_name="run", default_backend=["file"])
        for step in steps:
            tracking.log({"critic/score/mean": score}, step=step)
        tracking.finish()
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.1.jsonl", "metrics.jsonl"]
    frame = load_run(run_dir)
    assert list(frame.index) == [1, 2, 3, 4, 5]
    assert frame["critic/score/mean"].tolist() == [0.1, 0.1, 0.9, 0.9, 0.9]
