"""The launchers: scripts/train.py (checks, dry run, the exact verl command) and scripts/run_paper.py.

The training itself needs GPUs; what is checked here is everything before it: path checks, the composed
config (verl's own validation), the printed command, and that verl's real entry point composes our config
from that command (hydra's ``--cfg job`` prints the config and exits before any training starts).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bv_blend import cli
from bv_blend.paper import build_train_launch
from bv_blend.paper.pipeline import Step, paper_steps, run_steps
from tests._scripts import load_script


@pytest.fixture
def inputs(tmp_path):
    """Files the launcher needs to find (contents do not matter before training starts)."""
    model = tmp_path / "models" / "Qwen2.5-Math-7B"
    model.mkdir(parents=True)
    # the 16k-window copy the main config needs (scripts/widen_context.py); the check reads only this file
    (model / "config.json").write_text('{"max_position_embeddings": 16384}')
    paths = {"train": tmp_path / "train.parquet", "val": tmp_path / "val.parquet", "codebook": tmp_path / "cb.npz"}
    for path in paths.values():
        path.write_bytes(b"")
    return {**paths, "model": model, "out": tmp_path / "run out"}


def _train_argv(inputs, *extra):
    return [
        "--config", "qwen25_math_7b", "--train-files", str(inputs["train"]), "--val-files", str(inputs["val"]),
        "--model", str(inputs["model"]), "--codebook", str(inputs["codebook"]), "--output-dir", str(inputs["out"]),
        *extra,
    ]


def test_dry_run_prints_the_exact_command_and_runs_nothing(inputs, capsys):
    code = load_script("train").main(_train_argv(inputs, "--dry-run", "--", "trainer.total_training_steps=3"))
    out = capsys.readouterr().out
    assert code == 0 and "dry run" in out
    line = next(line for line in out.splitlines() if "verl.trainer.main_ppo" in line)
    words = shlex.split(line)
    env = dict(w.split("=", 1) for w in words[:2])
    argv = words[2:]
    assert argv[1:5] == ["-m", "verl.trainer.main_ppo", "--config-name", "paper/qwen25_math_7b"]
    assert f"data.train_files=[{inputs['train']}]" in argv and f"actor_rollout_ref.model.path={inputs['model']}" in argv
    assert f"algorithm.bv_blend.codebook_path={inputs['codebook']}" in argv
    assert "trainer.n_gpus_per_node=8" in argv and "trainer.nnodes=1" in argv
    assert argv[-1] == "trainer.total_training_steps=3"  # the user's overrides come last
    assert env["VERL_FILE_LOGGER_PATH"] == str(inputs["out"].resolve() / "metrics.jsonl")
    assert not inputs["out"].exists()  # a dry run writes nothing


@pytest.mark.parametrize(
    ("flag", "key", "message"),
    [
        ("--train-files", "train", "--train-files"),
        ("--val-files", "val", "--val-files"),
        ("--model", "model", "--model"),
        ("--codebook", "codebook", "--codebook"),
    ],
)
def test_missing_path_is_named(inputs, capsys, flag, key, message):
    missing = inputs[key].parent / "missing"
    argv = _train_argv(inputs, "--dry-run")
    argv[argv.index(flag) + 1] = str(missing)
    assert load_script("train").main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and str(missing) in err


def test_model_folder_must_hold_a_hugging_face_model(inputs):
    (inputs["model"] / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        build_train_launch(
            "grpo", train_files=[inputs["train"]], val_files=[inputs["val"]], model=inputs["model"]
        )


def test_bv_blend_needs_a_codebook_but_grpo_does_not(inputs):
    common = {"train_files": [inputs["train"]], "val_files": [inputs["val"]], "model": inputs["model"]}
    with pytest.raises(ValueError, match="pass --codebook"):
        build_train_launch("qwen25_math_7b", **common)
    launch = build_train_launch("grpo", **common)
    assert launch.config.algorithm.adv_estimator == "grpo"


def test_multi_node_needs_a_ray_cluster_and_sets_nnodes(inputs, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    common = {"train_files": [inputs["train"]], "val_files": [inputs["val"]], "model": inputs["model"],
              "codebook": inputs["codebook"], "nnodes": 2}
    with pytest.raises(ValueError, match="ray start --head"):
        build_train_launch("qwen25_math_7b", **common)
    launch = build_train_launch("qwen25_math_7b", ray_address="10.0.0.1:6379", **common)
    assert launch.env["RAY_ADDRESS"] == "10.0.0.1:6379" and "trainer.nnodes=2" in launch.argv
    assert launch.config.trainer.nnodes == 2 and launch.config.trainer.n_gpus_per_node == 8


def test_overrides_mistaken_for_files_are_caught(inputs, capsys):
    argv = _train_argv(inputs, "--dry-run")
    argv.insert(argv.index("--val-files") + 2, "trainer.total_training_steps=3")
    with pytest.raises(SystemExit):
        load_script("train").main(argv)
    assert "put them after `--`" in capsys.readouterr().err


def test_bad_override_fails_before_launch(inputs, capsys):
    assert load_script("train").main(_train_argv(inputs, "--dry-run", "--", "trainer.no_such_key=1")) == 2
    assert "no_such_key" in capsys.readouterr().err


@pytest.mark.slow
def test_verls_entry_point_composes_the_printed_command(inputs):
    """Run verl's real main_ppo with the launcher's argv plus hydra's --cfg job: it prints the config it
    would train with and exits before Ray or any model starts (~10-20 s, mostly importing verl)."""
    launch = build_train_launch(
        "grpo", train_files=[inputs["train"]], val_files=[inputs["val"]], model=inputs["model"],
        output_dir=inputs["out"], overrides=["trainer.total_training_steps=3"],
    )
    env = {**os.environ, **launch.env, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([*launch.argv, "--cfg", "job"], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    cfg = OmegaConf.create(result.stdout)
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.trainer.total_training_steps == 3
    assert cfg.data.train_files == [str(inputs["train"])] and cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.trainer.default_local_dir == str(inputs["out"].resolve() / "checkpoints")
    assert launch.env["TENSORBOARD_DIR"] == cfg.ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR


# ---------------------------------------------------------------- run_paper


def test_run_paper_dry_run_prints_the_three_steps_in_order(inputs, tmp_path, capsys):
    shard = tmp_path / "train-00000.parquet"
    shard.write_bytes(b"")
    argv = ["--openr1", str(shard), "--model", str(inputs["model"]), "--val-files", str(inputs["val"]),
            "--work-dir", str(tmp_path / "work"), "--num-clusters", "32", "--dry-run", "--", "trainer.save_freq=50"]
    assert load_script("run_paper").main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert [line.split("]")[0][1:] for line in lines] == ["prepare", "codebook", "train"]
    prepare, codebook, train = (shlex.split(line.split("] ", 1)[1]) for line in lines)
    assert prepare[1].endswith("prepare_openr1_math.py") and prepare[prepare.index("--tokenizer") + 1] == str(
        inputs["model"])
    train_parquet = prepare[prepare.index("--output") + 1]
    assert codebook[1:4] == ["-m", "bv_blend.cli", "codebook"] and codebook[4] == train_parquet
    assert codebook[codebook.index("--num-clusters") + 1] == "32"
    out_dir = Path(codebook[codebook.index("--out-dir") + 1])
    assert train[train.index("--codebook") + 1] == str(out_dir / "codebook.npz")
    assert train[train.index("--train-files") + 1] == str(out_dir / "train.parquet")
    assert train[-2:] == ["--", "trainer.save_freq=50"]
    assert not (tmp_path / "work").exists()


def test_run_paper_checks_inputs_first(inputs, tmp_path, capsys):
    argv = ["--openr1", str(tmp_path / "none.parquet"), "--model", str(inputs["model"]),
            "--val-files", str(inputs["val"]), "--dry-run"]
    assert load_script("run_paper").main(argv) == 2
    assert "--openr1" in capsys.readouterr().err


def test_steps_run_in_order_skip_done_ones_and_stop_at_a_failure(tmp_path, capsys):
    log = tmp_path / "log.txt"

    def step(name: str, code: int, output: Path | None = None) -> Step:
        script = f"open({str(log)!r}, 'a').write({name!r} + '\\n'); raise SystemExit({code})"
        return Step(name, [sys.executable, "-c", script], (output,) if output else ())

    done = tmp_path / "exists"
    done.write_text("")
    assert run_steps([step("a", 0), step("b", 0, done), step("c", 3), step("d", 0)]) == 3
    assert log.read_text().split() == ["a", "c"]
    assert "[b] outputs exist, skipped" in capsys.readouterr().out


def test_paper_steps_rejects_bad_inputs(inputs):
    with pytest.raises(ValueError, match="--openr1 needs"):
        paper_steps(openr1=[], model=inputs["model"], val_files=[inputs["val"]], work_dir=Path("w"))
    with pytest.raises(ValueError, match="--num-clusters"):
        paper_steps(openr1=[inputs["train"]], model=inputs["model"], val_files=[inputs["val"]], work_dir=Path("w"),
                    num_clusters=1)
    with pytest.raises(ValueError, match="not in configs/paper/"):
        paper_steps(openr1=[inputs["train"]], model=inputs["model"], val_files=[inputs["val"]], work_dir=Path("w"),
                    config="paper_grpo")


def test_pipeline_arguments_parse_with_the_real_scripts(inputs):
    """The data and codebook steps' arguments go through their commands' own argument parsers (CLI drift)."""
    steps = paper_steps(openr1=[inputs["train"]], model=inputs["model"], val_files=[inputs["val"]],
                        work_dir=inputs["out"], num_clusters=16, overrides=["trainer.save_freq=50"])
    prepare, codebook, train = steps
    prepared = load_script("prepare_openr1_math").parse_args(prepare.argv[2:])
    assert prepared.tokenizer == str(inputs["model"]) and prepared.output == str(prepare.outputs[0])
    assert codebook.argv[1:4] == ["-m", "bv_blend.cli", "codebook"]
    built = cli.codebook.parse(cli.build_parser()[1]["codebook"], codebook.argv[4:])
    assert built.num_clusters == 16 and built.inputs == [str(prepare.outputs[0])]
    assert Path(built.out_dir) / "codebook.npz" == codebook.outputs[0]
    trained = load_script("train").parse_args(train.argv[2:])
    assert trained.config == "qwen25_math_7b" and trained.codebook == codebook.outputs[0]
    assert trained.train_files == [codebook.outputs[1]] and trained.overrides == ["trainer.save_freq=50"]
