"""The context check (bv_blend/verl/context_budget.py): a prompt-plus-response budget beyond the model's context is
an error that names both numbers, in the paper launcher, the pipeline and the trainer hook's entry.

Models are tiny ``config.json`` fixtures (the check reads nothing else); configs are the real paper configs,
composed by hydra as verl's main_ppo composes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bv_blend.paper import build_train_launch, compose_paper_config
from bv_blend.paper.pipeline import paper_steps
from bv_blend.verl.context_budget import (
    ContextBudgetError,
    ContextBudgetWarning,
    check_context_budget,
    check_run,
    read_model_context,
    uses_our_code,
)
from tests._scripts import load_script


def _model(root: Path, name: str, **config) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", **config}))
    return folder


def _config(model: Path | str, prompt: int = 1024, response: int = 8192, max_model_len=None, override=None):
    return OmegaConf.create({
        "data": {"max_prompt_length": prompt, "max_response_length": response},
        "actor_rollout_ref": {"model": {"path": str(model), "override_config": override or {}},
                              "rollout": {"max_model_len": max_model_len}},
        "algorithm": {"adv_estimator": "bv_blend"},
    })


# ------------------------------------------------------------------------------------------ the rule


def test_a_budget_over_the_context_names_both_numbers_and_the_fix(tmp_path):
    model = _model(tmp_path, "Qwen2.5-Math-7B", max_position_embeddings=4096)
    with pytest.raises(ContextBudgetError) as info:
        check_context_budget(_config(model))
    message = str(info.value)
    assert "data.max_prompt_length 1024 + data.max_response_length 8192 = 9216 tokens" in message
    assert f"exceed the 4096-token window of {model}" in message and "max_position_embeddings" in message
    assert "scripts/widen_context.py" in message and "data.max_response_length <= 3072" in message


def test_a_budget_that_fills_the_context_exactly_passes(tmp_path):
    model = _model(tmp_path, "m", max_position_embeddings=4096)
    context = check_context_budget(_config(model, response=3072))
    assert context.tokens == 4096 and context.source.endswith("config.json: max_position_embeddings")


def test_the_widened_copys_context_holds_the_papers_budget(tmp_path):
    model = _model(tmp_path, "m16k", max_position_embeddings=16384, rope_theta=40000.0)
    assert check_context_budget(_config(model, max_model_len=9216)).tokens == 16384


def test_max_model_len_over_the_context_is_refused(tmp_path):
    model = _model(tmp_path, "m", max_position_embeddings=4096)
    with pytest.raises(ContextBudgetError, match=r"max_model_len 9216 exceeds the 4096-token context"):
        check_context_budget(_config(model, response=3072, max_model_len=9216))


def test_a_budget_over_max_model_len_is_refused_naming_it(tmp_path):
    model = _model(tmp_path, "m", max_position_embeddings=16384)
    with pytest.raises(ContextBudgetError) as info:
        check_context_budget(_config(model, max_model_len=8192))
    assert "= 9216 tokens exceed the 8192-token window" in str(info.value)
    assert "(actor_rollout_ref.rollout.max_model_len)" in str(info.value)


def test_the_context_of_a_multimodal_config_is_read_from_text_config(tmp_path):
    model = _model(tmp_path, "vl", text_config={"max_position_embeddings": 32768})
    context = read_model_context(model)
    assert context.tokens == 32768 and context.source.endswith("text_config.max_position_embeddings")


def test_a_config_without_a_context_length_is_an_error_as_in_verl(tmp_path):
    model = _model(tmp_path, "m", hidden_size=64)
    with pytest.raises(ContextBudgetError, match="has no max_position_embeddings"):
        check_context_budget(_config(model))


def test_a_broken_config_json_is_named(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    with pytest.raises(ContextBudgetError, match="not readable JSON"):
        read_model_context(model)


@pytest.mark.parametrize(
    "override",
    [
        {"rope_theta": 40000},
        {"max_position_embeddings": 16384},
        {"rope_parameters": {"rope_theta": 40000, "rope_type": "default"}},
        {"model_config": {"max_position_embeddings": 16384}},  # verl applies this nested entry instead
    ],
)
def test_widening_through_override_config_is_refused_with_the_reason(tmp_path, override):
    model = _model(tmp_path, "m", max_position_embeddings=4096)
    with pytest.raises(ContextBudgetError, match="vLLM never sees it") as info:
        check_context_budget(_config(model, response=3072, override=override))
    assert "widen_context.py" in str(info.value)


def test_other_override_config_keys_pass(tmp_path):
    model = _model(tmp_path, "m", max_position_embeddings=4096)
    assert check_context_budget(_config(model, response=3072, override={"attn_implementation": "sdpa"}))


def test_a_model_not_on_this_machine_is_a_loud_warning_naming_the_budget():
    with pytest.warns(ContextBudgetWarning, match=r"Could not check .* = 9216 tokens against the context of "
                                                  r"nobody-here/not-a-model"):
        assert check_context_budget(_config("nobody-here/not-a-model")) is None
    # with rollout.max_model_len set (the paper's configs), verl refuses it at the rollout server's start instead
    with pytest.warns(ContextBudgetWarning, match=r"refuse actor_rollout_ref.rollout.max_model_len 9216 once"):
        check_context_budget(_config("nobody-here/not-a-model", max_model_len=9216))


def test_a_hub_id_already_in_the_local_cache_is_checked(tmp_path, monkeypatch):
    from huggingface_hub import constants

    snapshot = tmp_path / "models--Qwen--Qwen2.5-Math-7B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    (tmp_path / "models--Qwen--Qwen2.5-Math-7B" / "refs").mkdir()
    (tmp_path / "models--Qwen--Qwen2.5-Math-7B" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ContextBudgetError, match="4096-token window of Qwen/Qwen2.5-Math-7B"):
        check_context_budget(_config("Qwen/Qwen2.5-Math-7B"))


# ----------------------------------------------------------------------- which runs the hook checks


def test_the_hook_checks_runs_that_use_bv_blend_and_leaves_the_others_alone(tmp_path):
    model = _model(tmp_path, "m", max_position_embeddings=4096)
    ours = _config(model)
    with pytest.raises(ContextBudgetError):
        check_run(ours)
    # a GRPO run of the paper kit uses our reward: checked too
    grpo_with_our_reward = OmegaConf.merge(ours, {"algorithm": {"adv_estimator": "grpo"}, "reward": {
        "custom_reward_function": {"path": "pkg://bv_blend.paper.rewards", "name": "compute_score"}}})
    assert uses_our_code(grpo_with_our_reward)
    with pytest.raises(ContextBudgetError):
        check_run(grpo_with_our_reward)
    # anyone else's run with bv_blend merely installed: verl's behaviour, untouched
    theirs = OmegaConf.merge(ours, {"algorithm": {"adv_estimator": "grpo"}})
    assert not uses_our_code(theirs) and check_run(theirs) is None


def test_the_hook_entry_reads_verls_composed_config(tmp_path):
    """verl's own ppo_trainer plus our keys: the check reads the config the trainer's __init__ receives."""
    model = _model(tmp_path, "m", max_position_embeddings=4096)
    cfg = compose_paper_config(None, ["data.max_response_length=8192", f"actor_rollout_ref.model.path={model}"])
    with pytest.raises(ContextBudgetError, match=r"512 \+ data.max_response_length 8192 = 8704 tokens exceed the 4096"):
        check_run(cfg)


# ------------------------------------------------------------------------------- the paper launchers


@pytest.fixture
def files(tmp_path):
    paths = {"train": tmp_path / "train.parquet", "val": tmp_path / "val.parquet", "codebook": tmp_path / "cb.npz"}
    for path in paths.values():
        path.write_bytes(b"")
    return paths


def test_the_launcher_refuses_the_16k_config_on_the_stock_4k_model(tmp_path, files):
    stock = _model(tmp_path, "Qwen2.5-Math-7B", max_position_embeddings=4096)
    common = {"train_files": [files["train"]], "val_files": [files["val"]], "codebook": files["codebook"]}
    with pytest.raises(ContextBudgetError, match="= 9216 tokens exceed the 4096-token window"):
        build_train_launch("qwen25_math_7b", model=stock, **common)
    # the 4k variant fits the stock model; the main config fits the widened copy
    assert build_train_launch("qwen25_math_7b_4k", model=stock, **common).config.data.max_response_length == 3072
    wide = _model(tmp_path, "Qwen2.5-Math-7B-16k", max_position_embeddings=16384)
    assert build_train_launch("qwen25_math_7b", model=wide, **common).config.data.max_response_length == 8192


def test_train_script_prints_the_error_and_starts_nothing(tmp_path, files, capsys):
    train = load_script("train")
    stock = _model(tmp_path, "Qwen2.5-Math-7B", max_position_embeddings=4096)
    out = tmp_path / "out"
    argv = ["--config", "grpo", "--train-files", str(files["train"]), "--val-files", str(files["val"]),
            "--model", str(stock), "--output-dir", str(out)]
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert "data.max_response_length 8192 = 9216 tokens exceed the 4096-token window" in err
    assert not out.exists()


def test_the_pipeline_checks_the_context_before_preparing_any_data(tmp_path, files):
    stock = _model(tmp_path, "Qwen2.5-Math-7B", max_position_embeddings=4096)
    kwargs = {"openr1": [files["train"]], "model": stock, "val_files": [files["val"]], "work_dir": tmp_path / "w"}
    with pytest.raises(ContextBudgetError, match="9216 tokens exceed the 4096-token window"):
        paper_steps(**kwargs)
    assert [step.name for step in paper_steps(config="qwen25_math_7b_4k", **kwargs)] == ["prepare", "codebook",
                                                                                          "train"]
