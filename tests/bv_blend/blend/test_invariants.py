"""Property-based checks of the spec's invariants (section 8) over random batches (hypothesis)."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bv_blend import BVBlendConfig, BVBlendEstimator
from tests._estimator_helpers import assert_same_state

NUM_CLUSTERS = 4


@st.composite
def batches(draw, prefix="g"):
    """Whole groups of 1..6 rows, each group in one cluster (or -1); binary or real rewards, shuffled rows."""
    num_groups = draw(st.integers(1, 8))
    binary = draw(st.booleans())
    reward = st.sampled_from([0.0, 1.0]) if binary else st.floats(-100, 100, allow_nan=False, width=32)
    rewards, uids, clusters = [], [], []
    for group in range(num_groups):
        size = draw(st.integers(1, 6))
        cluster = draw(st.integers(-1, NUM_CLUSTERS - 1))
        rewards += draw(st.lists(reward, min_size=size, max_size=size))
        uids += [f"{prefix}{group}"] * size
        clusters += [cluster] * size
    order = draw(st.permutations(range(len(rewards))))
    return (
        torch.tensor(rewards, dtype=torch.float32)[list(order)],
        np.array(uids, dtype=object)[list(order)],
        torch.tensor(clusters)[list(order)],
    )


configs = st.builds(
    BVBlendConfig,
    gamma=st.floats(0.05, 1.0),
    epsilon=st.floats(1e-8, 1e-2),
    temperature=st.floats(0.01, 10.0),
    n0=st.floats(0.1, 10.0),
    v_prior=st.floats(0.0, 2.0),
    weight_mode=st.sampled_from(["sem", "fixed", "neff", "sigma"]),
)


@settings(max_examples=60, deadline=None)
@given(configs, st.lists(batches(), min_size=1, max_size=4), st.sampled_from([torch.float16, torch.float32]))
def test_any_finite_input_gives_finite_output(config, calls, dtype):
    estimator = BVBlendEstimator(NUM_CLUSTERS, config)
    for rewards, uids, clusters in calls:
        advantages = estimator.compute(rewards.to(dtype), uids, clusters)
        assert advantages.dtype == torch.float32  # promoted, so a float16 reward cannot overflow
        assert torch.isfinite(advantages).all()
        assert all(np.isfinite(value) for value in estimator.metrics.values())
    state = estimator.state_dict()
    assert all(torch.isfinite(state[name]).all() for name in ("count", "mean", "second_moment"))


@settings(max_examples=60, deadline=None)
@given(configs, batches(prefix="history"), batches(), st.randoms(use_true_random=False))
def test_permuting_rows_permutes_advantages_and_keeps_the_state(config, history, batch, random):
    left, right = BVBlendEstimator(NUM_CLUSTERS, config), BVBlendEstimator(NUM_CLUSTERS, config)
    left.compute(*history)
    right.compute(*history)
    rewards, uids, clusters = batch
    order = list(range(len(rewards)))
    random.shuffle(order)
    expected = left.compute(rewards, uids, clusters)
    actual = right.compute(rewards[order], uids[order], clusters[order])
    # Row sums in another order differ by rounding only (float64 state); 0/1 rewards are exact.
    torch.testing.assert_close(actual, expected[order], rtol=1e-5, atol=1e-5)
    for name in ("count", "mean", "second_moment"):
        torch.testing.assert_close(left.state_dict()[name], right.state_dict()[name], rtol=1e-12, atol=1e-9)
    assert torch.equal(left.state_dict()["seen"], right.state_dict()["seen"])


@settings(max_examples=60, deadline=None)
@given(configs, batches(prefix="history"), batches(), st.integers(1, 5), st.randoms(use_true_random=False))
def test_padding_rows_change_no_advantage_and_no_state(config, history, batch, num_padding, random):
    plain, padded = BVBlendEstimator(NUM_CLUSTERS, config), BVBlendEstimator(NUM_CLUSTERS, config)
    plain.compute(*history)
    padded.compute(*history)
    rewards, uids, clusters = batch
    expected = plain.compute(rewards, uids, clusters)

    # verl's padding rows: uid "pad<hex>", any reward (even NaN) and any cluster id; interleaved at random.
    pad_rewards = torch.tensor([random.choice([0.0, 1.0, float("nan")]) for _ in range(num_padding)])
    pad_uids = np.array([f"pad{random.getrandbits(64):x}" for _ in range(num_padding)], dtype=object)
    pad_clusters = torch.tensor([random.randint(-5, 50) for _ in range(num_padding)])
    all_rewards = torch.cat([rewards, pad_rewards])
    all_uids = np.concatenate([uids, pad_uids])
    all_clusters = torch.cat([clusters, pad_clusters])
    # Interleave the padding rows at random places, keeping the real rows in their order, so that every
    # sum sees the same real values in the same order and the results must agree bit for bit.
    slots = sorted(random.sample(range(len(all_rewards)), num_padding))
    real, pads = iter(range(len(rewards))), iter(range(len(rewards), len(all_rewards)))
    order = [next(pads) if position in slots else next(real) for position in range(len(all_rewards))]
    actual = padded.compute(all_rewards[order], all_uids[order], all_clusters[order])

    position = {row: index for index, row in enumerate(order)}
    real_rows = [position[row] for row in range(len(rewards))]
    pad_rows = [position[row] for row in range(len(rewards), len(all_rewards))]
    torch.testing.assert_close(actual[real_rows], expected, rtol=0, atol=0)
    assert torch.count_nonzero(actual[pad_rows]) == 0
    assert_same_state(plain, padded)


@settings(max_examples=40, deadline=None)
@given(configs, st.lists(batches(), min_size=2, max_size=5), st.data())
def test_save_load_and_continue_equals_never_stopping(config, calls, data):
    stop_after = data.draw(st.integers(1, len(calls) - 1))
    uninterrupted = BVBlendEstimator(NUM_CLUSTERS, config)
    expected = [uninterrupted.compute(*call) for call in calls]

    first = BVBlendEstimator(NUM_CLUSTERS, config)
    for call in calls[:stop_after]:
        first.compute(*call)
    resumed = BVBlendEstimator(NUM_CLUSTERS, config)
    resumed.load_state_dict(first.state_dict())
    for call, advantages in zip(calls[stop_after:], expected[stop_after:], strict=True):
        assert torch.equal(resumed.compute(*call), advantages)
    assert_same_state(uninterrupted, resumed)
