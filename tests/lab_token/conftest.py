"""Tiny settings for the token-level lab's tests: a 5-step warm-up, 10 held-out prompts, 8 rollouts a step, 2 steps.

A model warmed up for 5 steps never scores, so :func:`random_scores` replaces the verifier's scores of the
*training* rollouts with seeded coin flips: the estimators then see groups of every kind, and what is tested is
that the lab hands those scores to verl's estimators and their advantages to the update, not what it learns.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from bv_blend.verl import runtime
from instruments.lab.token import run as run_module
from instruments.lab.token.run import LabSettings
from instruments.lab.token.runner import prepare_warmup
from instruments.lab.token.store import Store
from instruments.lab.token.suites import Suite

TINY = LabSettings(warmup_steps=5, val_prompts=10, budget=8, steps=2, pool_size=16, eval_every=1, eval_samples=2)


@pytest.fixture(autouse=True)
def fresh_runtime():
    runtime.reset()
    yield
    runtime.reset()


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> str:
    """A folder holding the tiny warmed-up model, made once for the session."""
    store = Store(tmp_path_factory.mktemp("lab_token_cache"))
    torch.set_num_threads(1)
    prepare_warmup(Suite("quick", TINY, (), (0,), (1e-4,)), store)
    return str(store.cache)


def coin_flip_scores(monkeypatch) -> None:
    """Training rollouts get seeded coin-flip scores (the held-out evaluation keeps the verifier's)."""
    real = run_module.sample

    def sample(model, tokenizer, problems, n, max_new_tokens=16):
        rollouts = real(model, tokenizer, problems, n, max_new_tokens)
        generator = torch.Generator().manual_seed(int(rollouts.sequences.sum()))
        return replace(rollouts, scores=(torch.rand(len(rollouts.scores), generator=generator) < 0.5).float())

    monkeypatch.setattr(run_module, "sample", sample)


@pytest.fixture()
def random_scores(monkeypatch):
    coin_flip_scores(monkeypatch)
