"""Issue 37, E: ``run.estimated_success`` (``true_success`` before issue 37), the limits' p, is an m-sample estimate
of the current policy's success rate (m = ``oracle_samples``, 8 in the regime), not the true p. Tested on the real
function (other tests replace it):

- it is the share of m responses that pass, drawn under the oracle's own seed: a direct count of the same draws
  agrees, and the run's own random stream does not move;
- on a tiny model where p is computable (4 new tokens at most, the response tree enumerated with the model's own
  probabilities at T = 1), the estimate is within sampling error of p, per prompt.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from instruments.demo.reward import compute_score
from instruments.demo.standin import _prompt_ids, sample, warmed_up_model
from instruments.demo.task import Problem
from instruments.lab.token.run import estimated_success, held_out, oracle_seed, pool_of
from tests.lab_token.conftest import TINY

SETTINGS = replace(TINY, max_new_tokens=4)  # "#### 92": four tokens, so the whole response tree can be enumerated
PRUNE = 1e-5  # response prefixes below this probability are not expanded; their mass bounds the error of p


@pytest.fixture(scope="module")
def taught(tiny_cache) -> tuple[torch.nn.Module, object, list[Problem]]:
    """The tiny model, taught one pool problem's answer for 20 steps (p about 0.4: neither 0 nor 1), and a second
    problem with another answer (p near 0): two prompts with different p, so a mix-up between them shows."""
    torch.manual_seed(0)
    val = held_out(SETTINGS)
    model, tokenizer = warmed_up_model(SETTINGS.standin(tiny_cache), {p.question for p in val})
    pool = pool_of(SETTINGS, val)
    first = pool[0]
    second = next(p for p in pool if str(p.answer) != str(first.answer))
    prompt = _prompt_ids(tokenizer, first.question)
    target = tokenizer(f"#### {first.answer}", add_special_tokens=False)["input_ids"]
    ids, labels = torch.tensor([prompt + target]), torch.tensor([[-100] * len(prompt) + target])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(20):
        optimizer.zero_grad()
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
    return model.eval(), tokenizer, [first, second]


@torch.no_grad()
def exact_success(model, tokenizer, problem: Problem, max_new_tokens: int) -> tuple[float, float]:
    """(p counted over the enumerated responses, the probability mass not enumerated): p lies in [p, p + mass].
    A response ends at EOS or after ``max_new_tokens`` tokens, and is scored as ``sample`` scores it."""
    prompt, eos = _prompt_ids(tokenizer, problem.question), tokenizer.eos_token_id
    frontier, success, pruned = [([], 1.0)], 0.0, 0.0
    for depth in range(max_new_tokens):
        if not frontier:
            break
        logits = model(input_ids=torch.tensor([prompt + response for response, _ in frontier])).logits[:, -1]
        grown = []
        for (response, weight), probs in zip(frontier, torch.softmax(logits.double(), -1).tolist(), strict=True):
            for token, prob in enumerate(probs):
                mass = weight * prob
                if mass < PRUNE:
                    pruned += mass
                elif token == eos or depth == max_new_tokens - 1:
                    text = tokenizer.decode([t for t in response + [token] if t != eos], skip_special_tokens=True)
                    success += mass * compute_score(problem.family, text, str(problem.answer))
                else:
                    grown.append((response + [token], mass))
        frontier = grown
    return success, pruned


def test_estimated_success_is_a_direct_count_of_its_own_draws_and_leaves_the_run_s_stream(taught):
    model, tokenizer, problems = taught
    settings = replace(SETTINGS, oracle_samples=16)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    estimate = estimated_success(model, tokenizer, problems, settings, seed=3, step=7)
    assert torch.equal(torch.get_rng_state(), before)  # the run's training stream is where it was
    torch.manual_seed(oracle_seed(3, 7))
    draws = sample(model, tokenizer, problems, 16, settings.max_new_tokens)
    counted = [float(draws.scores[i * 16:(i + 1) * 16].mean()) for i in range(len(problems))]
    np.testing.assert_array_equal(estimate, np.array(counted, dtype=np.float32))
    assert estimate.shape == (2,) and set((estimate * 16).round(6).tolist()) <= set(range(17))  # shares of 16


@pytest.mark.parametrize("samples", [8, 256])
def test_estimated_success_is_within_sampling_error_of_the_computed_p(taught, samples):
    """m = 8 is the regime's: an estimate within a few sigma of p, not p (the limits' label says so)."""
    model, tokenizer, problems = taught
    exact = [exact_success(model, tokenizer, problem, SETTINGS.max_new_tokens) for problem in problems]
    assert all(pruned < 0.05 for _, pruned in exact)  # p is known to within 0.05
    assert 0.1 < exact[0][0] < 0.9 and exact[1][0] + exact[1][1] < 0.05  # two prompts that a mix-up would swap
    seeds = range(4)
    estimates = np.array([estimated_success(model, tokenizer, problems, replace(SETTINGS, oracle_samples=samples),
                                            seed=seed, step=1) for seed in seeds])  # fmt: skip
    mean = estimates.mean(0)  # 4 x m draws a prompt
    for value, (low, pruned) in zip(mean, exact, strict=True):
        high = low + pruned
        p = min(max(value, low), high)  # the p in [low, high] nearest the estimate
        sigma = np.sqrt(max(p * (1 - p), 1 / (4 * samples)) / (4 * samples))
        assert low - 4 * sigma <= value <= high + 4 * sigma, (value, low, high)
