"""How the tiny model's supervised warm-up sizes the end-to-end runs' signal: the pass rate of each of the history
run's prompts (transformers' sampling at T = 1, the rollout's temperature and response length), and from it the
chance that a step of the history run has no mixed group (every group all-equal: verl makes no update, and the
weight-sync check cannot tell stale weights from fresh). It sized ``_assets.WARMUP_STEPS``; run it again when the
warm-up, the task or the tiny model changes. Not a test: a probe that prints (a few minutes on 2 cores).

    python -m tests.e2e.probe_warmup /tmp/probe --warmup-steps 300 600
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from instruments.cpu.launch import verl_rule_score
from tests.e2e._assets import build_cpu_assets
from tests.e2e._history import BATCH, ROLLOUT_N, history_task

RESPONSE_LENGTH = 16  # cpu_tiny's data.max_response_length


def pass_rates(work: Path, warmup_steps: int, draws: int, seed: int = 1) -> np.ndarray:
    """Each of the history run's prompts' pass rate over ``draws`` samples, after ``warmup_steps`` of warm-up."""
    assets = build_cpu_assets(work, warmup_steps)
    frame = pd.read_parquet(history_task(assets, work / "history").train_file)
    tokenizer = AutoTokenizer.from_pretrained(work / "model")
    model = AutoModelForCausalLM.from_pretrained(work / "model").eval()
    torch.manual_seed(seed)
    rates = []
    rows = zip(frame["prompt"], frame["data_source"], frame["reward_model"], strict=True)
    for prompt, source, reward in tqdm(rows, total=len(frame), desc=f"warm-up {warmup_steps}", unit="prompt"):
        ids = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 max_new_tokens=RESPONSE_LENGTH, num_return_sequences=draws,
                                 pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        texts = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
        rates.append(np.mean([verl_rule_score(source, text, reward["ground_truth"]) for text in texts]))
    return np.array(rates)


def no_mixed_group(rates: np.ndarray, draws: int = 2000, seed: int = 0) -> np.ndarray:
    """The chance that a step's BATCH prompts, drawn without replacement, give ROLLOUT_N-rollout groups that are all
    all-equal, for ``draws`` random draws of the step's prompts."""
    all_equal = rates**ROLLOUT_N + (1 - rates) ** ROLLOUT_N
    rng = np.random.default_rng(seed)
    return np.array([np.prod(all_equal[rng.choice(len(rates), BATCH, replace=False)]) for _ in range(draws)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", type=Path, help="a scratch folder (the assets are built there, one subfolder a warm-up)")
    p.add_argument("--warmup-steps", type=int, nargs="+", default=[300, 600])
    p.add_argument("--draws", type=int, default=200, help="samples a prompt")
    a = p.parse_args()
    for steps in a.warmup_steps:
        rates = pass_rates(a.work / f"warmup_{steps}", steps, a.draws)
        chance = no_mixed_group(rates)
        print(f"warm-up {steps}: pass rates {np.round(rates, 2).tolist()}")
        print(f"  P(a step has no mixed group): mean over draws {chance.mean():.3f}, worst draw {chance.max():.3f}")


if __name__ == "__main__":
    main()
