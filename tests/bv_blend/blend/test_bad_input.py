"""Bad input: a clear error that names the problem, and the state left bit-for-bit as it was."""

import io

import numpy as np
import pytest
import torch

from bv_blend import BVBlendConfig, BVBlendEstimator
from tests._estimator_helpers import assert_same_state, batch_of_groups


@pytest.fixture
def estimator():
    estimator = BVBlendEstimator(num_clusters=3)
    estimator.compute(*batch_of_groups([[0, 1, 1], [1, 1, 1]], [0, 1], "history"))
    return estimator


def snapshot(estimator):
    copy = BVBlendEstimator(estimator.num_clusters, estimator.config)
    copy.load_state_dict(estimator.state_dict())
    return copy


def good_batch():
    return batch_of_groups([[1, 0], [1, 1]], [0, 2], "now")


def with_row(batch, index, *, reward=None, uid=None, cluster=None):
    rewards, uids, clusters = (part.clone() if hasattr(part, "clone") else part.copy() for part in batch)
    if reward is not None:
        rewards[index] = reward
    if uid is not None:
        uids[index] = uid
    if cluster is not None:
        clusters[index] = cluster
    return rewards, uids, clusters


@pytest.mark.parametrize(
    ("make_batch", "message"),
    [
        (lambda: with_row(good_batch(), 1, reward=float("nan")), r"Rewards must be finite; rows \[1\]"),
        (lambda: with_row(good_batch(), 3, reward=float("inf")), r"Rewards must be finite; rows \[3\]"),
        (lambda: with_row(good_batch(), 2, cluster=3), r"Cluster id 3 \(row 2\) is outside -1..2"),
        (lambda: with_row(good_batch(), 0, cluster=-2), r"Cluster id -2 \(row 0\) is outside -1..2"),
        (lambda: with_row(good_batch(), 1, cluster=1), "A prompt group mixes clusters 0 and 1"),
        (lambda: with_row(good_batch(), 1, cluster=-1), "A prompt group mixes clusters -1 and 0"),
        (lambda: (torch.zeros(3), np.array(["a"] * 4, dtype=object), torch.zeros(4, dtype=torch.long)),
         r"one entry per row; got lengths \{'rewards': 3, 'group_ids': 4"),
        (lambda: (torch.zeros(4), np.array(["a"] * 4, dtype=object), torch.zeros(3, dtype=torch.long)),
         "'cluster_ids': 3"),
        (lambda: (torch.zeros(2, 2), np.array(["a"] * 2, dtype=object), torch.zeros(2, dtype=torch.long)),
         "rewards must be a 1-D float tensor"),
        (lambda: (torch.zeros(2), np.array(["a"] * 2, dtype=object), torch.zeros(2)),
         "cluster_ids must be a 1-D integer"),
        (lambda: (torch.zeros(2), np.array([0.5, 1.5]), torch.zeros(2, dtype=torch.long)),
         "group_ids must be strings or integers"),
        (lambda: (torch.zeros(2), np.array(["a", None], dtype=object), torch.zeros(2, dtype=torch.long)),
         r"group_ids must not be missing: row 1 holds None"),
    ],
)
def test_bad_input_raises_a_clear_error_and_keeps_the_state(estimator, make_batch, message):
    before = snapshot(estimator)
    metrics_before = dict(estimator.metrics)
    with pytest.raises((ValueError, TypeError), match=message):
        estimator.compute(*make_batch())
    assert_same_state(before, estimator)
    assert estimator.metrics == metrics_before


def test_overflowing_rewards_are_refused_before_the_history_changes(estimator):
    before = snapshot(estimator)
    rewards, uids, clusters = good_batch()
    with pytest.raises(ValueError, match="Rewards are too large"):
        estimator.compute(rewards.double() * 1e200, uids, clusters)
    assert_same_state(before, estimator)


def test_token_level_face_rejects_bad_input_and_keeps_the_state(estimator):
    before = snapshot(estimator)
    metrics_before = dict(estimator.metrics)
    uids = np.array(["a", "a"], dtype=object)
    token_rewards, mask = torch.zeros(2, 3), torch.ones(2, 3)
    token_rewards[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"Rewards must be finite; rows \[1\]"):
        estimator.compute_token_level(token_rewards, mask, uids, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="must both be \\(batch, response_length\\)"):
        estimator.compute_token_level(torch.zeros(2, 3), torch.ones(2, 4), uids, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="response_mask has no columns"):
        estimator.compute_token_level(torch.zeros(2, 0), torch.ones(2, 0), uids, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="valid must be a bool mask"):
        estimator.compute_token_level(torch.zeros(2, 3), mask, uids, torch.tensor([0, 0]), valid=torch.ones(2))
    assert_same_state(before, estimator)
    assert estimator.metrics == metrics_before


def test_valid_mask_of_the_wrong_length_or_dtype(estimator):
    before = snapshot(estimator)
    with pytest.raises(ValueError, match="'valid': 3"):
        estimator.compute(*good_batch(), valid=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="valid must be a bool mask"):
        estimator.compute(*good_batch(), valid=torch.ones(4))
    assert_same_state(before, estimator)


def test_empty_batch_is_a_no_op(estimator):
    before = snapshot(estimator)
    advantages = estimator.compute(torch.zeros(0), np.array([], dtype=object), torch.zeros(0, dtype=torch.long))
    assert advantages.shape == (0,)
    assert_same_state(before, estimator)
    assert estimator.metrics["bv_blend/effective_signal_ratio"] == 0.0


def test_a_batch_of_only_padding_is_a_no_op(estimator):
    before = snapshot(estimator)
    rewards, uids, clusters = good_batch()
    advantages = estimator.compute(rewards, uids, clusters, valid=torch.zeros(4, dtype=torch.bool))
    assert torch.count_nonzero(advantages) == 0
    assert_same_state(before, estimator)


def test_state_dict_survives_torch_save_with_weights_only(estimator):
    buffer = io.BytesIO()
    torch.save(estimator.state_dict(), buffer)
    buffer.seek(0)
    restored = BVBlendEstimator(3)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert_same_state(estimator, restored)


def test_loading_another_k_or_config_fails_unless_asked(estimator):
    state = estimator.state_dict()
    other_k = BVBlendEstimator(num_clusters=5)
    with pytest.raises(ValueError, match="K=3 clusters but this estimator has K=5"):
        other_k.load_state_dict(state)
    assert other_k.state_dict()["count"].tolist() == [0.0] * 5
    other_k.load_state_dict(state, allow_num_clusters_change=True)
    assert other_k.num_clusters == 3 and torch.equal(other_k.state_dict()["mean"], state["mean"])

    other_config = BVBlendEstimator(num_clusters=3, config=BVBlendConfig(temperature=0.5))
    with pytest.raises(ValueError, match=r"another config \(saved, current\): \{'temperature': \(0.1, 0.5\)\}"):
        other_config.load_state_dict(state)
    other_config.load_state_dict(state, allow_config_change=True)
    assert other_config.config.temperature == 0.5
    assert torch.equal(other_config.state_dict()["second_moment"], state["second_moment"])


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda s: s.pop("mean"), r"missing \['mean'\]"),
        (lambda s: s.update(count=torch.zeros(2, dtype=torch.float64)), r"'count' must be a tensor of shape \(3,\)"),
        (lambda s: s.update(mean=torch.full((3,), float("nan"), dtype=torch.float64)), "NaN or infinite"),
        (lambda s: s.update(count=-torch.ones(3, dtype=torch.float64)), "negative"),
        (lambda s: s.update(format_version=99), "Unsupported BV-Blend state format 99"),
        (lambda s: s.update(num_updates=-1), "num_updates"),
    ],
)
def test_corrupt_state_is_rejected_and_nothing_changes(estimator, corrupt, message):
    target = BVBlendEstimator(num_clusters=3)
    target.compute(*good_batch())
    before = snapshot(target)
    state = estimator.state_dict()
    corrupt(state)
    metrics_before = dict(target.metrics)
    with pytest.raises(ValueError, match=message):
        target.load_state_dict(state)
    assert_same_state(before, target)
    assert target.metrics == metrics_before
