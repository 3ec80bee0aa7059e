"""A pure-torch stand-in for verl's GRPO on the demo's task: how the demo's RL settings were chosen (docs/cpu.md).

A verl run on 2 cores costs ~2.5 minutes of start-up and ~5 s a step; this loop runs the same experiment in about a
minute, so that learning rates, warm-ups and batch shapes can be compared before a few real verl runs confirm the
choice. It keeps what decides learning and drops the machinery:

- the same tiny Qwen2, tokenizer, warm-up, task, held-out split and verifier (instruments/demo/reward.py);
- rollouts sampled with HF ``generate`` at temperature 1, no top-k/top-p, at most 16 new tokens, up to the EOS;
- verl's GRPO advantage per group, ``(r - mean) / (std + 1e-6)`` with the unbiased std (or BV-Blend's estimator,
  with each family as its cluster);
- one on-policy step of verl's policy-gradient loss with ``loss_agg_mode=token-mean`` (the PPO ratio is 1 on
  policy, so the clipped loss is ``-A * log p`` averaged over response tokens), AdamW (0.9, 0.999), weight decay
  0.01, gradient clipping at 1.0: verl's actor defaults;
- the held-out pass rate at T=1 every ``eval_every`` steps.

    python -m instruments.demo.standin --lr 1e-4 --steps 40 --format-share 0.5
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from instruments.demo import model as tiny
from instruments.demo.reward import compute_score
from instruments.demo.task import FAMILIES, Problem, held_out_problems, make_problems
from instruments.demo.warmup import _prompt_ids, supervised_warmup


@dataclass
class StandinSettings:
    warmup_steps: int = 800
    format_share: float = 0.5
    method: str = "grpo"  # or "bv_blend"
    lr: float = 1e-4
    steps: int = 40
    batch: int = 16
    n: int = 4
    val_prompts: int = 120
    val_samples: int = 8
    eval_every: int = 10
    seed: int = 0  # model, warm-up and split
    rl_seed: int = 0  # order of training prompts and sampling
    cache: str = ""  # folder for warmed-up models, reused by runs with the same warm-up settings
    task: str = "demo"  # instruments/demo/task.TASKS: the demo's, or the no-revisit regime's wider one


@dataclass
class Rollouts:
    sequences: torch.Tensor  # (B*n, P+R) left-padded prompt, then response
    prompt_mask: torch.Tensor  # (B*n, P)
    response_mask: torch.Tensor  # (B*n, R): response tokens up to and including the EOS
    scores: torch.Tensor  # (B*n,) 0/1 from verl's scorer


@torch.no_grad()
def sample(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, problems: list[Problem], n: int,
           max_new_tokens: int = 16) -> Rollouts:
    """``n`` responses per problem at temperature 1, scored as verl scores them."""
    ids = [_prompt_ids(tokenizer, p.question) for p in problems]
    width, pad = max(map(len, ids)), tokenizer.pad_token_id
    prompts = torch.tensor([[pad] * (width - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    out = model.generate(input_ids=prompts, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                         top_p=1.0, max_new_tokens=max_new_tokens, num_return_sequences=n, pad_token_id=pad,
                         eos_token_id=tokenizer.eos_token_id)
    response = out[:, width:]
    is_eos = response == tokenizer.eos_token_id
    last = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full((len(response),), response.shape[1] - 1))
    response_mask = (torch.arange(response.shape[1])[None] <= last[:, None]).long()
    texts = tokenizer.batch_decode(torch.where(response_mask.bool(), response, pad), skip_special_tokens=True)
    scores = torch.tensor([compute_score(problems[i // n].family, text, str(problems[i // n].answer))
                           for i, text in enumerate(texts)])
    return Rollouts(out, mask.repeat_interleave(n, 0), response_mask, scores)


def grpo_advantages(scores: torch.Tensor, n: int, epsilon: float = 1e-6) -> torch.Tensor:
    """verl's GRPO outcome advantage for consecutive groups of ``n`` rows (unbiased std, as torch.std)."""
    groups = scores.view(-1, n)
    return ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + epsilon)).view(-1)


def policy_gradient_step(model: Qwen2ForCausalLM, optimizer: torch.optim.Optimizer, rollouts: Rollouts,
                         advantages: torch.Tensor) -> float:
    """One on-policy step of the token-mean policy-gradient loss; returns the loss.

    ``advantages`` is one value per response (B,) or verl's token-level tensor (B, R), as its estimators return it.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    model.train()
    width = rollouts.prompt_mask.shape[1]
    mask = torch.cat([rollouts.prompt_mask, rollouts.response_mask], 1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=rollouts.sequences, attention_mask=mask, position_ids=positions).logits
    log_probs = torch.log_softmax(logits[:, width - 1:-1].float(), -1)
    token_log_probs = log_probs.gather(-1, rollouts.sequences[:, width:, None]).squeeze(-1)
    response_mask = rollouts.response_mask.float()
    loss = -(advantages.float() * token_log_probs * response_mask).sum() / response_mask.sum()
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    model.eval()
    return float(loss.detach())


def held_out_pass_rates(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, problems: list[Problem],
                        samples: int) -> dict[str, float]:
    """Pass rate at T=1 per family and over all responses."""
    per_family: dict[str, list[float]] = {}
    for start in range(0, len(problems), 100):
        chunk = problems[start:start + 100]
        scores = sample(model, tokenizer, chunk, samples).scores.tolist()
        for i, score in enumerate(scores):
            per_family.setdefault(chunk[i // samples].family, []).append(score)
    rates = {family: float(np.mean(v)) for family, v in per_family.items()}
    rates["all"] = float(np.mean([x for v in per_family.values() for x in v]))
    return rates


def warmed_up_model(s: StandinSettings, held_out: set[str]) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """The demo's model and warm-up (instruments/demo/pipeline.prepare_model); cached in ``s.cache`` if given."""
    torch.set_num_threads(1)
    tokenizer = tiny.build_tokenizer(tiny.TinyModelSpec.vocab, seed=s.seed, exclude=held_out, task=s.task)
    model = tiny.build_model(tiny.TinyModelSpec(seed=s.seed), tokenizer)
    task = "" if s.task == "demo" else f"_{s.task}"  # the demo's cache names as they were
    name = f"warmup{s.warmup_steps}_format{s.format_share}_seed{s.seed}_val{s.val_prompts}{task}.pt"
    cached = Path(s.cache) / name if s.cache else None
    if cached is not None and cached.is_file():
        model.load_state_dict(torch.load(cached))
        return model.eval(), tokenizer
    supervised_warmup(model, tokenizer, s.warmup_steps, batch_size=32, lr=1e-3, seed=s.seed, exclude=held_out,
                      format_share=s.format_share, task=s.task)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), cached)
    return model, tokenizer


def _rounded(row: dict) -> str:
    return json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})


def run(s: StandinSettings, on_row: Callable[[dict], None] = lambda row: None) -> list[dict]:
    """Warm-up, then ``s.steps`` RL steps; one row per evaluation (step, signal ratio and reward since the last
    evaluation, held-out pass rates), also handed to ``on_row`` as it comes."""
    val = held_out_problems(s.val_prompts, s.seed)
    held_out = {p.question for p in val}
    model, tokenizer = warmed_up_model(s, held_out)
    train = make_problems(s.steps * s.batch, s.seed, exclude=held_out)
    torch.manual_seed(s.rl_seed)
    random.Random(s.rl_seed).shuffle(train)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.999), weight_decay=0.01)
    estimator = None
    if s.method == "bv_blend":
        from bv_blend.blend.estimator import BVBlendEstimator

        estimator = BVBlendEstimator(len(FAMILIES))
        cluster_of = {family: k for k, family in enumerate(FAMILIES)}
    rows = [{"step": 0, **held_out_pass_rates(model, tokenizer, val, s.val_samples)}]
    on_row(rows[-1])
    signal, reward = [], []
    for step in range(1, s.steps + 1):
        problems = train[(step - 1) * s.batch:step * s.batch]
        rollouts = sample(model, tokenizer, problems, s.n)
        if estimator is None:
            advantages = grpo_advantages(rollouts.scores, s.n)
        else:
            groups = np.repeat(np.arange(len(problems)), s.n)
            clusters = torch.tensor(np.repeat([cluster_of[p.family] for p in problems], s.n))
            advantages = estimator.compute(rollouts.scores.double(), groups, clusters).float()
        signal.append(float((advantages.view(-1, s.n).abs().sum(1) > 1e-6).float().mean()))
        reward.append(float(rollouts.scores.mean()))
        policy_gradient_step(model, optimizer, rollouts, advantages)
        if step % s.eval_every == 0 or step == s.steps:
            rows.append({"step": step, "signal": float(np.mean(signal)), "reward": float(np.mean(reward)),
                         **held_out_pass_rates(model, tokenizer, val, s.val_samples)})
            on_row(rows[-1])
            signal, reward = [], []
    return rows


def main(argv: list[str] | None = None) -> None:
    d = StandinSettings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, value in vars(d).items():
        p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    p.add_argument("--out", type=Path, help="also write the rows as JSON here")
    a = p.parse_args(argv)
    if a.method not in ("grpo", "bv_blend"):
        p.error(f"--method {a.method}: grpo or bv_blend")
    s = StandinSettings(**{k: getattr(a, k) for k in vars(d)})
    rows = run(s, on_row=lambda row: print(_rounded(row), flush=True))
    if a.out is not None:
        a.out.write_text(json.dumps({"settings": vars(s), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
