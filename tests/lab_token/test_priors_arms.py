"""Issue 37, C: every priors arm of the token lab's regime reads its priors (bv2_priors did not: its advantages were
bit-identical to bv_cluster2's), and a rerun of the suite's command runs the fixed arm again.

The batch and the prior file are made here (no model): what is tested is that the arm's estimator, built by
``TokenAdvantages`` exactly as a run builds it, starts from the file.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from instruments import regime
from instruments.lab.token.advantages import TokenAdvantages
from instruments.lab.token.arms import PRIORS_TWINS, REGIME_ARMS
from instruments.lab.token.run import RunRecord
from instruments.lab.token.store import SettingsMismatch, Store

K = 3
QUESTIONS = [f"question {i}" for i in range(6)]
# each question its own prior mean (1/8 ... 6/8): a pattern that batch whitening cannot undo
PRIORS = {q: [1.0] * (i + 1) + [0.0] * (7 - i) for i, q in enumerate(QUESTIONS)}
POOL = {q: i % K for i, q in enumerate(QUESTIONS)}


def _batch(n: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray, np.ndarray]:
    """Every question once, n rows each, scores alternating (so an n = 1 batch is not all one score)."""
    rows = len(QUESTIONS) * n
    scores = torch.tensor([float(i % 2 == 0) for i in range(rows)])
    keys = np.repeat(np.array(QUESTIONS, dtype=object), n)
    uids = np.repeat(np.array([f"1:{j}" for j in range(len(QUESTIONS))], dtype=object), n)
    clusters = np.array([POOL[q] for q in keys])
    return scores, torch.ones(rows, 3, dtype=torch.int64), uids, clusters, keys


def _advantages(arm, prior_file: Path | None) -> torch.Tensor:
    advantages = TokenAdvantages(arm, K, None if prior_file is None else str(prior_file), POOL)
    return advantages(*_batch(arm.n))


@pytest.fixture()
def prior_file(tmp_path: Path) -> Path:
    path = tmp_path / "priors.json"
    path.write_text(json.dumps(PRIORS))
    return path


def test_every_priors_arm_has_a_twin_without_priors():
    priors_arms = {key for key, arm in REGIME_ARMS.items() if arm.priors}
    assert priors_arms == set(PRIORS_TWINS) == {key for key, arm in regime.ARMS.items() if arm.priors}
    for key, twin in PRIORS_TWINS.items():
        arm, other = REGIME_ARMS[key], REGIME_ARMS[twin]
        assert (other.adv_estimator, other.n, other.priors) == (arm.adv_estimator, arm.n, False)


@pytest.mark.parametrize("key", sorted(PRIORS_TWINS))
def test_every_priors_arm_s_advantages_differ_from_its_twin_s(key, prior_file):
    """On the same batch: the priors arm against its twin in the suite, and against itself without the file."""
    arm = REGIME_ARMS[key]
    with_priors = _advantages(arm, prior_file)
    assert not torch.allclose(with_priors, _advantages(REGIME_ARMS[PRIORS_TWINS[key]], None))
    assert not torch.allclose(with_priors, _advantages(replace(arm, priors=False), None))


def test_a_priors_arm_without_the_pool_s_clusters_is_refused(prior_file):
    with pytest.raises(ValueError, match="needs the pool's prompts and their clusters"):
        TokenAdvantages(REGIME_ARMS["bv2_priors"], K, str(prior_file))


def _record(key: str) -> RunRecord:
    return RunRecord(key, 0, 1e-4, [0], [0.1], {}, [], [], [], [], [])


def test_a_run_of_an_earlier_revision_of_the_arm_is_run_again(tmp_path):
    """The suite's stored bv2_priors runs were made without its priors (revision 0): the same command reruns them;
    a run of another arm under that key is still refused."""
    store, arm = Store(tmp_path), REGIME_ARMS["bv2_priors"]
    assert arm.revision == 1
    old = replace(arm, revision=0)
    store.save(old, _record(arm.key))
    assert store.load(old, 0, 1e-4) is not None
    assert store.load(arm, 0, 1e-4) is None  # stale: runner.execute runs it again, and save overwrites it
    store.save(arm, _record(arm.key))
    assert store.load(arm, 0, 1e-4) is not None
    assert store.load(replace(arm, label="renamed"), 0, 1e-4) is not None  # a label names runs, it does not make them
    with pytest.raises(SettingsMismatch, match="the arm's definition changed"):
        store.load(replace(arm, n=4), 0, 1e-4)
    with pytest.raises(SettingsMismatch):
        store.load(old, 0, 1e-4)  # a newer revision is never taken for an older one
