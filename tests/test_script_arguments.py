"""Every script checks its arguments before expensive work: a bad value fails at once, naming the option, and
nothing is loaded, read or run. Spies record whether the expensive step (an encoder load, verl, a benchmark,
reading a log) was reached."""

from __future__ import annotations

import pytest

from bv_blend.cli import main as bv_blend_command
from bv_blend.codebook import encode
from tests._scripts import load_script


@pytest.fixture
def encoder_loads(monkeypatch) -> list[str]:
    """Records every attempt to load a sentence encoder (and makes it fail, should one happen)."""
    loads: list[str] = []

    def load(self, model=encode.DEFAULT_ENCODER, **kwargs):
        loads.append(model)
        raise AssertionError("the encoder was loaded")

    monkeypatch.setattr(encode.TextEncoder, "__init__", load)
    return loads


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-clusters", "0"], "must be a positive integer, got 0"),
        (["--num-clusters", "-3"], "must be a positive integer, got -3"),
        (["--num-clusters", "4", "--batch-size", "0"], "--batch-size must be >= 1"),
        (["--num-clusters", "4", "--examples-per-cluster", "-1"], "must be >= 0"),
    ],
)
def test_build_codebook_rejects_bad_options_before_reading_or_loading(argv, message, encoder_loads, capsys):
    with pytest.raises(SystemExit) as exit_info:
        # not even the file is read
        bv_blend_command(["codebook", "/does/not/exist.parquet", "--out-dir", "/tmp/never", *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert encoder_loads == []


def test_build_codebook_checks_k_against_the_prompts_before_loading_the_encoder(tmp_path, encoder_loads, capsys):
    from tests.bv_blend.codebook.test_annotate import questions, verl_frame

    source = tmp_path / "train.parquet"
    verl_frame(questions(2)).to_parquet(source, index=False)
    assert bv_blend_command(["codebook", str(source), "--out-dir", str(tmp_path / "out"), "-k", "500"]) == 2
    assert "larger than the number of prompts" in capsys.readouterr().err
    assert encoder_loads == [] and not (tmp_path / "out").exists()


def test_build_codebook_missing_input_is_named_before_loading_the_encoder(tmp_path, encoder_loads, capsys):
    missing = tmp_path / "missing.parquet"
    assert bv_blend_command(["codebook", str(missing), "--out-dir", str(tmp_path / "out"), "-k", "4"]) == 2
    assert str(missing) in capsys.readouterr().err and encoder_loads == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "16"], "must be PROMPTSxROLLOUTS"),
        (["--sizes", "0x8"], "must be PROMPTSxROLLOUTS"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--response-length", "0"], "--response-length must be >= 1"),
        (["--num-clusters", "0"], "--num-clusters must be >= 1"),
    ],
)
def test_bench_estimator_rejects_bad_arguments_before_benchmarking(argv, message, monkeypatch, capsys):
    script = load_script("bench_estimator")
    benchmarked = []
    monkeypatch.setattr(script, "bench_size", lambda *args: benchmarked.append(args))
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err and benchmarked == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--n", "0"], "--n must be >= 1"),
        (["--ks", "64", "0"], "--ks must be >= 1"),
        (["--n", "100", "--ks", "256"], "must be at most --n"),
        (["--n", "100", "--ratio-n", "3000"], "must be at most --n"),
    ],
)
def test_bench_codebook_rejects_bad_arguments_before_encoding(argv, message, encoder_loads, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script("bench_codebook").main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err and encoder_loads == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--run", "a=x", "--run", "broken"], "--run expects NAME=PATH, got 'broken'"),
        (["--run", "a=x", "--run", "a=y"], "given twice"),
        (["--run", "a=x", "--smooth", "0"], "must be >= 1"),
    ],
)
def test_plot_dynamics_checks_every_run_before_reading_any(argv, message, monkeypatch, capsys):
    script = load_script("plot_dynamics")
    read = []
    monkeypatch.setattr(script, "load_run", lambda path: read.append(path))
    assert script.main(argv) == 2
    assert message in capsys.readouterr().err and read == []


def test_the_demo_answers_help_without_the_set_up_and_runs_where_it_is_called(tmp_path):
    """scripts/demo.sh: --help comes from the existing .venv at once (BV_BLEND_VENV points the set-up at a new folder,
    which it would create first); a bad --model is read from the caller's folder and refused before any work (the
    script demo.sh runs there, called directly: demo.sh would run the set-up first)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    demo = Path(__file__).resolve().parents[1] / "scripts" / "demo.sh"
    env = {**os.environ, "BV_BLEND_VENV": str(tmp_path / "venv")}
    shown = subprocess.run(["bash", str(demo), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert shown.returncode == 0 and "usage: demo_cpu.py" in shown.stdout, shown.stderr
    assert not (tmp_path / "venv").exists()  # the set-up did not run
    (tmp_path / "mine").mkdir()
    refused = subprocess.run([sys.executable, str(demo.with_name("demo_cpu.py")), "--model", "mine"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 2 and f"{tmp_path / 'mine'} is not a Hugging Face model folder" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no demo_out, no task written
