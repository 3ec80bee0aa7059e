"""scripts/widen_context.py (bv_blend/paper/context_window.py): the 16k-window copy of a local Qwen2.5-Math folder.

The source is a tiny Qwen2 ``config.json`` in the layout Qwen2.5-Math-7B ships (transformers-4 keys, rope theta
10000, 4096 positions, an inert sliding_window) beside stand-in weight and tokenizer files. What transformers
makes of the copy is checked with transformers itself (AutoConfig and Qwen2's rotary embedding).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bv_blend.paper import compose_paper_config
from bv_blend.paper.context_window import widen_context
from bv_blend.verl.context_budget import ContextBudgetError, check_context_budget
from tests._scripts import load_script

# Qwen2.5-Math-7B's config.json, scaled down (the keys and the context-related values are the real ones).
QWEN25_MATH = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "max_window_layers": 2,
    "vocab_size": 1000, "max_position_embeddings": 4096, "rope_theta": 10000.0, "sliding_window": 4096,
    "use_sliding_window": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def _source(root: Path, config: dict | None = None, model_max_length: int = 131072) -> Path:
    src = root / "Qwen2.5-Math-7B"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(config or QWEN25_MATH))
    (src / "model-00001-of-00002.safetensors").write_bytes(b"weights-1")
    (src / "model-00002-of-00002.safetensors").write_bytes(b"weights-2")
    (src / "tokenizer.json").write_text("{}")
    (src / "tokenizer_config.json").write_text(json.dumps({"model_max_length": model_max_length}))
    return src


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def test_the_script_writes_the_lineages_config_and_links_everything_else(tmp_path, capsys):
    src = _source(tmp_path)
    before = _snapshot(src)
    out = tmp_path / "Qwen2.5-Math-7B-16k"
    assert load_script("widen_context").main(["--model", str(src), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "config.json: rope_theta: 10000.0 -> 40000.0" in printed
    assert "config.json: max_position_embeddings: 4096 -> 16384" in printed
    assert "config.json: sliding_window: 4096 -> None" in printed

    config = json.loads((out / "config.json").read_text())
    assert config == {**QWEN25_MATH, "rope_theta": 40000.0, "max_position_embeddings": 16384, "sliding_window": None}
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (out / name).is_symlink() and (out / name).resolve() == (src / name).resolve()
    assert _snapshot(src) == before  # the source is untouched


def test_transformers_reads_theta_40000_and_16384_positions_from_the_copy(tmp_path):
    from transformers import AutoConfig
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    src = _source(tmp_path)
    out = widen_context(src, tmp_path / "wide").out_dir
    stock, wide = AutoConfig.from_pretrained(src), AutoConfig.from_pretrained(out)
    assert stock.rope_parameters["rope_theta"] == 10000.0 and wide.rope_parameters["rope_theta"] == 40000.0
    assert wide.max_position_embeddings == 16384 and wide.sliding_window is None
    head_dim = QWEN25_MATH["hidden_size"] // QWEN25_MATH["num_attention_heads"]
    expected = 40000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    torch.testing.assert_close(Qwen2RotaryEmbedding(wide).inv_freq.double(), expected, rtol=1e-6, atol=0)
    assert not torch.allclose(Qwen2RotaryEmbedding(stock).inv_freq.double(), expected)


def test_the_copy_holds_the_main_configs_budget_and_the_stock_model_does_not(tmp_path):
    src = _source(tmp_path)
    out = widen_context(src, tmp_path / "wide").out_dir
    main = compose_paper_config("qwen25_math_7b")
    assert check_context_budget(main, out).tokens == 16384
    with pytest.raises(ContextBudgetError, match="9216 tokens exceed the 4096-token window"):
        check_context_budget(main, src)


def test_a_transformers_5_config_gets_theta_in_rope_parameters(tmp_path):
    config = {k: v for k, v in QWEN25_MATH.items() if k != "rope_theta"}
    config["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}
    result = widen_context(_source(tmp_path, config), tmp_path / "wide")
    written = json.loads((result.out_dir / "config.json").read_text())
    assert written["rope_parameters"] == {"rope_theta": 40000.0, "rope_type": "default"}
    assert "rope_theta" not in written
    assert result.changes["config.json"]["rope_parameters.rope_theta"] == (10000.0, 40000.0)


def test_a_tokenizer_limit_below_the_new_window_is_raised_in_a_copy(tmp_path):
    src = _source(tmp_path, model_max_length=4096)
    result = widen_context(src, tmp_path / "wide")
    tokenizer_config = result.out_dir / "tokenizer_config.json"
    assert not tokenizer_config.is_symlink()
    assert json.loads(tokenizer_config.read_text())["model_max_length"] == 16384
    assert json.loads((src / "tokenizer_config.json").read_text())["model_max_length"] == 4096


def test_copy_copies_instead_of_linking(tmp_path):
    src = _source(tmp_path)
    result = widen_context(src, tmp_path / "wide", copy=True)
    weights = result.out_dir / "model-00001-of-00002.safetensors"
    assert not weights.is_symlink() and weights.read_bytes() == b"weights-1"
    assert "model-00001-of-00002.safetensors" in result.copied and not result.linked


@pytest.mark.parametrize(
    ("change", "error", "says"),
    [
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, ValueError, "already scales its rotary embedding"),
        ({"use_sliding_window": True}, ValueError, "enables sliding-window attention"),
        ({"max_position_embeddings": 32768}, ValueError, "narrower than the model's 32768"),
        ({"max_position_embeddings": None}, ValueError, "no integer max_position_embeddings"),
    ],
)
def test_configs_this_conversion_does_not_fit_are_refused_and_nothing_is_written(tmp_path, change, error, says):
    src = _source(tmp_path, {**QWEN25_MATH, **change})
    with pytest.raises(error, match=says):
        widen_context(src, tmp_path / "wide")
    assert not (tmp_path / "wide").exists()


def test_an_existing_output_is_never_overwritten(tmp_path, capsys):
    src = _source(tmp_path)
    out = tmp_path / "wide"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert load_script("widen_context").main(["--model", str(src), "--out", str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    with pytest.raises(ValueError, match="not the model folder itself"):
        widen_context(src, src)


def test_a_folder_without_config_json_is_named(tmp_path, capsys):
    assert load_script("widen_context").main(["--model", str(tmp_path), "--out", str(tmp_path / "wide")]) == 2
    assert f"--model {tmp_path.resolve()} has no config.json" in capsys.readouterr().err


def test_bad_numbers_stop_at_argument_parsing(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_script("widen_context").main(["--model", str(tmp_path), "--out", str(tmp_path / "w"), "--rope-theta", "0"])
    assert "must be positive" in capsys.readouterr().err
