"""The pure-torch stand-in that chose the demo's settings computes what verl computes: GRPO's advantage (checked
against verl's own function) and a policy-gradient step that raises the log-probability of a rewarded response."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from instruments.demo import model as tiny
from instruments.demo import standin
from instruments.demo.task import make_problems


def test_grpo_advantages_equal_verl():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    torch.manual_seed(0)
    n, groups = 4, 6
    scores = (torch.rand(groups * n) < 0.5).float()
    scores[:n] = 1.0  # an all-right group: advantage 0
    mask = torch.ones(groups * n, 5)
    rewards = torch.zeros(groups * n, 5)
    rewards[:, -1] = scores
    verl_adv, _ = compute_grpo_outcome_advantage(rewards, mask, np.repeat(np.arange(groups), n).astype(object))
    ours = standin.grpo_advantages(scores, n)
    assert torch.allclose(ours, verl_adv[:, 0], atol=1e-6)
    assert torch.equal(ours[:n], torch.zeros(n))


@pytest.fixture(scope="module")
def small_model():
    torch.manual_seed(0)
    tokenizer = tiny.build_tokenizer(tiny.TinyModelSpec.vocab)
    return tiny.build_model(tiny.TinyModelSpec(), tokenizer), tokenizer


def _response_log_prob(model, rollouts, row):
    width = rollouts.prompt_mask.shape[1]
    mask = torch.cat([rollouts.prompt_mask, rollouts.response_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=rollouts.sequences, attention_mask=mask,
                       position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits[:, width - 1:-1]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, rollouts.sequences[:, width:, None]).squeeze(-1)
    return float((lp * rollouts.response_mask)[row].sum())


def test_policy_gradient_step_raises_the_rewarded_response(small_model):
    model, tokenizer = small_model
    torch.manual_seed(1)
    rollouts = standin.sample(model, tokenizer, make_problems(2, seed=0), n=2)
    assert rollouts.sequences.shape[0] == 4 and rollouts.scores.shape == (4,)
    assert ((rollouts.response_mask.sum(1) >= 1) & (rollouts.response_mask.sum(1) <= 16)).all()
    before = _response_log_prob(model, rollouts, 0)
    advantages = torch.tensor([1.0, 0.0, 0.0, 0.0])
    standin.policy_gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.5), rollouts, advantages)
    assert _response_log_prob(model, rollouts, 0) > before
