"""scripts/offline_priors.py without a trainer run: verl's validation dump -> the prior file, and the command it runs.

The dumps are written by verl's own writer (``PPOTrainer._write_generations``, what ``trainer.validation_data_dir``
calls) with what verl puts in them: each sample's prompt ids (left-padded, as in verl's batches) decoded with the
tokenizer's ``skip_special_tokens=True``, and its key ``{uid}_{session}_{index}`` under a fresh uuid. The tokenizer
is the demo's real one (instruments.run.tiny), the rows the demo's task. The command the dry run prints is composed
by verl's real ``main_ppo`` with ``--cfg job``, which exits before Ray or any model starts.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from bv_blend.cli import main as bv_blend_command
from bv_blend.history.keys import prompt_key
from bv_blend.history.priors import (
    TrainingPrompt,
    UnmatchedSamplesError,
    load_priors,
    priors_from_dump,
    read_generation_dump,
    scores_from_dump,
    summarize_priors,
)
from bv_blend.verl import offline_priors
from bv_blend.verl.offline_priors import compose, plan, prompt_renderer, render_training_prompts, val_only_overrides
from instruments.run import tiny
from instruments.run.task import write_task
from tests._scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
PROMPT_LENGTH = 64  # configs/cpu_tiny.yaml: data.max_prompt_length


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict:
    """The demo's tokenizer and a 2-layer model saved as a model folder, and a demo task of 24 training rows."""
    work = tmp_path_factory.mktemp("offline_priors")
    tokenizer = tiny.build_tokenizer(tiny.TinyModelSpec.vocab)
    model_dir = tiny.save(tiny.build_model(tiny.TinyModelSpec(), tokenizer), tokenizer, work / "model")
    train, _ = write_task(work / "task", n_train=24, n_val=5, seed=0)
    overrides = [f"data.train_files={train}", f"actor_rollout_ref.model.path={model_dir}"]
    return {"work": work, "tokenizer": tokenizer, "train": train, "model": model_dir, "overrides": overrides,
            "config": compose("cpu_tiny", overrides)}


def _as_verl_decodes(tokenizer, messages: list[dict]) -> str:
    """A prompt as verl's trainer writes it into the dump: the chat template with the generation prompt, tokenized,
    left-padded to the prompt length, decoded without special tokens (trainer_base._validate)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, Mapping) else ids)  # transformers 5 returns a BatchEncoding
    padded = [tokenizer.pad_token_id] * (PROMPT_LENGTH - len(ids)) + ids
    return tokenizer.decode(padded, skip_special_tokens=True)


def _dump(work: Path, samples: list[tuple[str, float, object]], per_session: int = 1, name: str = "dump",
          output: str = "#### {index}") -> Path:
    """A validation dump written by verl's own writer; ``samples``: (input, score, ground truth) per session."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    inputs, outputs, gts, scores, keys = [], [], [], [], []
    for session, (text, score, truth) in enumerate(samples):
        uid = str(uuid.uuid4())
        for index in range(per_session):
            inputs.append(text)
            outputs.append(output.format(index=index))
            gts.append(truth)
            scores.append(score)
            keys.append(f"{uid}_{session}_{index}")
    folder = work / name
    PPOTrainer._write_generations(inputs, outputs, gts, scores, {"reward": scores, "uid": keys}, str(folder), 0)
    return folder / "0.jsonl"


def _rows(train: Path) -> pd.DataFrame:
    return pd.read_parquet(train)


def test_training_prompts_render_as_verl_writes_them_into_the_dump(assets):
    render = prompt_renderer(assets["config"])
    for messages in _rows(assets["train"])["prompt"][:5]:
        messages = messages.tolist()
        rendered = render(messages)
        assert rendered == _as_verl_decodes(assets["tokenizer"], messages)
        assert messages[-1]["content"] in rendered and rendered.endswith("assistant\n")


def test_a_long_prompt_is_rendered_left_truncated_as_the_agent_loop_sends_it(assets):
    config = compose("cpu_tiny", [*assets["overrides"], "data.max_prompt_length=8"])
    messages = [{"role": "user", "content": "What is 12 + 34 + 56 + 78? Answer with the number."}]
    tokenizer = assets["tokenizer"]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
    assert len(ids) > 8
    assert prompt_renderer(config)(messages) == tokenizer.decode(ids[-8:], skip_special_tokens=True)


def test_a_dump_converts_to_each_prompts_scores(assets, tmp_path, monkeypatch):
    prompts = render_training_prompts(assets["config"])
    frame = _rows(assets["train"])
    assert [p.key for p in prompts] == [prompt_key(m, i) for m, i in zip(frame["prompt"], frame["extra_info"],
                                                                           strict=True)]
    tokenizer = assets["tokenizer"]
    samples, expected = [], {}
    for row, (messages, reward) in enumerate(zip(frame["prompt"], frame["reward_model"], strict=True)):
        key = prompt_key(messages)
        for sample in range(3):
            score = float((row + sample) % 2)
            samples.append((_as_verl_decodes(tokenizer, messages.tolist()), score, reward["ground_truth"]))
            expected.setdefault(key, []).append(score)  # duplicate rows share a key: their samples pool
    # two outputs per session (a multi-output agent loop): one sample each, with the session's score
    dump = _dump(tmp_path, samples, per_session=2)
    out = tmp_path / "priors.json"
    summary = priors_from_dump(dump, prompts, out)
    written = json.loads(out.read_text())
    assert written == expected
    assert {k: v.tolist() for k, v in load_priors(out, "test").items()} == expected
    monkeypatch.setenv("HOME", str(tmp_path))  # prior_file=~/priors.json reaches us unexpanded from hydra
    assert {k: v.tolist() for k, v in load_priors("~/priors.json", "test").items()} == expected
    assert summary.prompts == len(expected) == summary.training_prompts and summary.without_samples == 0
    assert summary.samples == 3 * len(frame)
    flat = [s for scores in expected.values() for s in scores]
    assert summary.mean_score == pytest.approx(sum(flat) / len(flat))


def test_a_sample_of_no_training_prompt_is_an_error_naming_it(assets, tmp_path):
    prompts = render_training_prompts(assets["config"])
    frame = _rows(assets["train"])
    tokenizer = assets["tokenizer"]
    good = (_as_verl_decodes(tokenizer, frame["prompt"][0].tolist()), 1.0, frame["reward_model"][0]["ground_truth"])
    raw = frame["prompt"][1].tolist()[-1]["content"]  # the raw question, not the templated prompt verl sends
    dump = _dump(tmp_path, [good, (raw, 0.0, None)])
    out = tmp_path / "priors.json"
    with pytest.raises(UnmatchedSamplesError, match=r"1 of the 2 samples .* line 2 \(no training row renders"):
        priors_from_dump(dump, prompts, out)
    assert not out.exists()


def test_a_sample_whose_ground_truth_differs_from_its_rows_is_unmatched(assets, tmp_path):
    frame = _rows(assets["train"])
    messages = frame["prompt"][0].tolist()
    prompts = [TrainingPrompt(prompt_key(messages), _as_verl_decodes(assets["tokenizer"], messages), "7")]
    with pytest.raises(UnmatchedSamplesError, match="another ground truth"):
        scores_from_dump(read_generation_dump(_dump(tmp_path, [(prompts[0].rendered, 1.0, "8")])), prompts)


@pytest.mark.parametrize("score", [1.5, -0.5, float("nan")])
def test_a_score_outside_0_1_is_an_error_and_writes_nothing(assets, tmp_path, score):
    frame = _rows(assets["train"])
    messages = frame["prompt"][0].tolist()
    text = _as_verl_decodes(assets["tokenizer"], messages)
    prompts = [TrainingPrompt(prompt_key(messages), text)]
    dump = _dump(tmp_path, [(text, 1.0, None), (text, score, None)])
    out = tmp_path / "priors.json"
    with pytest.raises(ValueError, match=r"line 2: score .* is not a number in \[0, 1\]"):
        priors_from_dump(dump, prompts, out)
    assert not out.exists()


def test_an_output_with_unicode_line_separators_stays_one_sample(tmp_path):
    """verl dumps outputs unescaped (ensure_ascii=False); SmolLM2 wrote a U+2028, at which str.splitlines() breaks."""
    odd = "Sammy\u2028saw \x85 and \x1c then #### {index}"
    dump = _dump(tmp_path, [("Q1", 1.0, "1"), ("Q2", 0.0, "2")], per_session=2, output=odd)
    assert len(dump.read_text().splitlines()) > 4  # the separators are in the file, raw
    samples = read_generation_dump(dump)
    assert [(s.prompt, s.score) for s in samples] == [("Q1", 1.0), ("Q2", 0.0)]


def test_rows_that_render_alike_are_told_apart_by_ground_truth_else_pooled(tmp_path):
    prompts = [TrainingPrompt("a", "Q", "1"), TrainingPrompt("b", "Q", "2"), TrainingPrompt("c", "Q", "2")]
    dump = _dump(tmp_path, [("Q", 1.0, "1"), ("Q", 0.0, "2"), ("Q", 1.0, "2")])
    # b and c: the same prompt and the same answer, samples of one distribution; each key gets them all
    assert scores_from_dump(read_generation_dump(dump), prompts) == {"a": [1.0], "b": [0.0, 1.0], "c": [0.0, 1.0]}


def test_the_summary_counts_all_right_and_all_wrong_prompts():
    summary = summarize_priors({"a": [1, 1], "b": [0, 0], "c": [1, 0], "d": [0, 0]}, ["a", "b", "c", "d", "e"])
    assert (summary.prompts, summary.samples, summary.mean_score) == (4, 8, 0.375)
    assert (summary.all_right, summary.all_wrong, summary.without_samples) == (0.25, 0.5, 1)
    assert "4 x 2 samples" in summary.lines()[0]


def test_val_only_overrides_sample_the_training_prompts_at_the_runs_temperature(assets, tmp_path):
    config = compose("cpu_tiny", [*assets["overrides"], "actor_rollout_ref.rollout.temperature=0.7",
                                  "data.val_max_samples=5", "algorithm.bv_blend.prior_file=/not/yet.json"])
    overrides = val_only_overrides(config, 6, tmp_path / "dump")
    job = compose("cpu_tiny", [*assets["overrides"], "actor_rollout_ref.rollout.temperature=0.7", *overrides])
    assert job.trainer.val_only and job.trainer.val_before_train and job.trainer.resume_mode == "disable"
    assert list(job.data.val_files) == [str(assets["train"])] and job.data.val_max_samples == -1
    assert job.data.val_batch_size == offline_priors.VAL_BATCH_SAMPLES // 6 + 1  # ~4096 responses a batch
    kwargs = job.actor_rollout_ref.rollout.val_kwargs
    assert (kwargs.n, kwargs.do_sample, kwargs.temperature) == (6, True, 0.7)
    assert job.trainer.validation_data_dir == str(tmp_path / "dump")
    assert job.algorithm.bv_blend.prior_file is None  # the file this run writes is not read by it


def test_every_key_the_val_only_run_sets_is_one_verl_declares_and_reads(assets, tmp_path):
    from tests._verl_schema import check_key  # the schema of the installed verl and the reads in its source

    config = compose("cpu_tiny", [*assets["overrides"], "algorithm.adv_estimator=spo",
                                  "+algorithm.spo.offline_values=null"])
    keys = [override.split("=", 1)[0] for override in val_only_overrides(config, 8, tmp_path)]
    assert "trainer.val_only" in keys and "algorithm.bv_blend.prior_file" in keys
    assert "algorithm.spo.offline_values" in keys
    assert [finding for key in keys if (finding := check_key(key))] == []


def test_greedy_sampling_is_refused(assets, tmp_path):
    config = compose("cpu_tiny", [*assets["overrides"], "actor_rollout_ref.rollout.temperature=0"])
    with pytest.raises(ValueError, match="greedy policy gives N copies"):
        val_only_overrides(config, 8, tmp_path)


def test_a_paper_config_that_needs_a_prior_file_generates_without_one(assets, tmp_path):
    job = plan("paper/bv_blend_n2_priors", assets["overrides"], 8, tmp_path / "dump", cpu=False)
    assert job.config.algorithm.bv_blend.prior_file is None and job.config.trainer.val_only
    assert job.argv[1:5] == ["-m", "verl.trainer.main_ppo", "--config-name", "paper/bv_blend_n2_priors"]


@pytest.fixture
def no_run(monkeypatch) -> list:
    """Records (and refuses) any start of verl's trainer."""
    started: list = []

    def refuse(*args, **kwargs):
        started.append(args)
        raise AssertionError("the trainer was started")

    monkeypatch.setattr(offline_priors, "run_generation", refuse)
    return started




@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "p.json", "data.train_files=x"], "--config-name is required"),
        (["--cpu", "--samples", "0", "--out", "p.json"], "--samples 0 must be >= 1"),
        (["--cpu", "--out", "p.json", "train.parquet"], "are not hydra overrides"),
        (["--config-name", "bv_blend", "--timeout-s", "5", "--out", "p.json"], "--timeout-s applies to --cpu"),
    ],
)
def test_bad_arguments_fail_before_anything_is_composed(argv, message, capsys, tmp_path, monkeypatch, no_run):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(offline_priors, "compose", lambda *a: pytest.fail("composed"))
    with pytest.raises(SystemExit) as exit_info:
        load_script("offline_priors").main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_a_missing_training_file_fails_before_the_trainer_starts(assets, tmp_path, capsys, no_run):
    script = load_script("offline_priors")
    rc = script.main(["--cpu", "--out", str(tmp_path / "p.json"), "data.train_files=/no/such.parquet",
                      f"actor_rollout_ref.model.path={assets['model']}"])
    assert rc == 2 and "/no/such.parquet does not exist" in capsys.readouterr().err and no_run == []


def test_the_script_converts_an_earlier_dump_without_generating(assets, tmp_path, capsys, no_run):
    frame = _rows(assets["train"])
    samples = [(_as_verl_decodes(assets["tokenizer"], m.tolist()), 1.0, r["ground_truth"])
               for m, r in zip(frame["prompt"], frame["reward_model"], strict=True)]
    dump, out = _dump(tmp_path, samples), tmp_path / "priors.json"
    script = load_script("offline_priors")
    assert script.main(["--cpu", "--from-dump", str(dump), "--out", str(out), *assets["overrides"]]) == 0
    printed = capsys.readouterr().out
    assert no_run == [] and set(load_priors(out, "test")) == set(map(prompt_key, frame["prompt"]))
    assert "all-right prompts: 100.0%" in printed and "wall time" in printed


def test_the_installed_command_converts_a_dump_without_the_cpu_harness(assets, tmp_path, capsys, no_run, monkeypatch):
    """`bv-blend priors`, the package's own command: the same conversion through the shared parser, with the CPU
    harness (an instrument, outside the wheel) unimportable."""
    frame = _rows(assets["train"])
    samples = [(_as_verl_decodes(assets["tokenizer"], m.tolist()), 0.0, r["ground_truth"])
               for m, r in zip(frame["prompt"], frame["reward_model"], strict=True)]
    dump, out = _dump(tmp_path, samples), tmp_path / "priors.json"
    for name in ["instruments.cpu", *(m for m in sys.modules if m.startswith("instruments.cpu."))]:
        monkeypatch.setitem(sys.modules, name, None)  # any import of it now fails, even of a loaded submodule
    argv = ["priors", "--config-name", "cpu_tiny", "--from-dump", str(dump), "--out", str(out), *assets["overrides"]]
    assert bv_blend_command(argv) == 0
    assert no_run == [] and set(load_priors(out, "test")) == set(map(prompt_key, frame["prompt"]))
    assert "all-wrong prompts: 100.0%" in capsys.readouterr().out


@pytest.mark.slow
def test_the_dry_run_prints_a_command_verls_main_ppo_composes(assets, tmp_path, capsys, no_run):
    out = tmp_path / "priors.json"
    script = load_script("offline_priors")
    assert script.main(["--cpu", "--dry-run", "--samples", "5", "--out", str(out), *assets["overrides"]]) == 0
    command = shlex.split(capsys.readouterr().out.splitlines()[0])
    assert no_run == [] and not out.exists()
    env = dict(word.split("=", 1) for word in command[: command.index(sys.executable)])
    assert env["VERL_PLATFORM"] == "cpu" and "instruments.cpu" in env["VERL_USE_EXTERNAL_MODULES"]
    argv = command[command.index(sys.executable):]
    assert argv[1:5] == ["-m", "verl.trainer.main_ppo", "--config-name", "cpu_tiny"]
    result = subprocess.run([*argv, "--cfg", "job"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**_env(), "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    job = OmegaConf.create(result.stdout)
    assert job.trainer.val_only and job.trainer.val_before_train and job.trainer.resume_mode == "disable"
    assert list(job.data.val_files) == [str(assets["train"])]
    assert job.actor_rollout_ref.rollout.val_kwargs.n == 5 and job.actor_rollout_ref.rollout.val_kwargs.do_sample
    assert job.trainer.validation_data_dir == str(tmp_path / "priors_generations")


def _env() -> dict[str, str]:
    import os

    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}
