"""Negative token filtering (companions spec section 1): the keep mask, its counts and metrics, and what verl's own
``vanilla`` loss makes of the keep weights under every ``loss_agg_mode``.

The loss is verl's (``compute_policy_loss_vanilla`` with ``rollout_is_weights``); the test of the registered ``ntf``
loss through ``ppo_loss`` belongs to the verl glue.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla
from verl.workers.config import FSDPActorConfig

from bv_blend.companions import NTFConfig, keep_counts, keep_mask, keep_weights, ntf_metrics

ROW1_LOGPROBS = [-0.1, -2.3, -0.05, -4.0, -0.2, -0.3, -1.0, -0.01, -0.5, -0.7]
LOSS_AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def worked_example():
    """Row 0: A = +1 on 4 tokens (then padding); row 1: A = -1 on 10 tokens with the spec's old log-probs."""
    old_log_prob = torch.tensor([[-0.3, -0.6, -0.2, -0.9] + [0.0] * 6, ROW1_LOGPROBS])
    advantages = torch.tensor([[1.0] * 4 + [0.0] * 6, [-1.0] * 10])
    mask = torch.tensor([[True] * 4 + [False] * 6, [True] * 10])
    return old_log_prob, advantages, mask


@pytest.fixture(scope="module")
def actor_config():
    return FSDPActorConfig(strategy="fsdp", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1, rollout_n=1)


def vanilla(actor_config, old_log_prob, advantages, mask, mode, weights=None):
    """verl's vanilla loss at ratio 1 (log_prob = old_log_prob, as on the first PPO epoch), dp = 1."""
    loss, _ = compute_policy_loss_vanilla(
        old_log_prob=old_log_prob,
        log_prob=old_log_prob.clone(),
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=mode,
        config=actor_config,
        rollout_is_weights=weights,
    )
    return loss.item()


# ------------------------------------------------------------------------------------------- worked example
def test_worked_example_keeps_only_the_least_likely_negative_token():
    old_log_prob, advantages, mask = worked_example()
    keep = keep_mask(old_log_prob, advantages, mask, keep_ratio=0.1)
    assert keep[0].all()  # positive row (and its padding) untouched
    assert keep[1].nonzero().flatten().tolist() == [3]  # k = 1: the token with log-prob -4.0


@pytest.mark.parametrize(
    ("mode", "ntf", "plain"),
    [
        ("token-mean", -3 / 14, 6 / 14),  # the spec's -0.214286 and 0.428571: the denominator stays 14
        ("token-sum", -3.0, 6.0),
        ("seq-mean-token-sum", -1.5, 3.0),
        ("seq-mean-token-mean", (-1 + 1 / 10) / 2, 0.0),  # row 1 keeps its 10-token denominator
        ("seq-mean-token-sum-norm", -1.5 / 10, 3.0 / 10),  # horizon T = 10
    ],
)
def test_filtered_tokens_add_zero_and_keep_their_place_in_every_denominator(actor_config, mode, ntf, plain):
    old_log_prob, advantages, mask = worked_example()
    keep = keep_mask(old_log_prob, advantages, mask, keep_ratio=0.1)
    weights = keep_weights(keep, None, old_log_prob.dtype)
    assert vanilla(actor_config, old_log_prob, advantages, mask, mode, weights) == pytest.approx(ntf, abs=1e-6)
    assert vanilla(actor_config, old_log_prob, advantages, mask, mode) == pytest.approx(plain, abs=1e-6)


def test_a_filtered_mask_instead_of_weights_would_change_the_per_row_denominator():
    """Why the keep mask goes in as weights: as a mask, seq-mean-token-mean divides row 1 by 1 instead of 10."""
    old_log_prob, advantages, mask = worked_example()
    keep = keep_mask(old_log_prob, advantages, mask, keep_ratio=0.1)
    losses = -advantages
    as_weights = agg_loss(losses * keep, mask, "seq-mean-token-mean").item()
    as_mask = agg_loss(losses, mask & keep, "seq-mean-token-mean").item()
    assert as_weights == pytest.approx(-0.45) and as_mask == pytest.approx(0.0)


def test_worked_example_metrics():
    old_log_prob, advantages, mask = worked_example()
    keep = keep_mask(old_log_prob, advantages, mask, keep_ratio=0.1)
    metrics = ntf_metrics(old_log_prob, advantages, mask, keep)
    filtered = [lp for i, lp in enumerate(ROW1_LOGPROBS) if i != 3]
    assert metrics == pytest.approx(
        {
            "ntf/neg_token_frac": 10 / 14,
            "ntf/neg_row_ratio": 1 / 2,
            "ntf/kept_frac_of_neg": 1 / 10,
            "ntf/kept_logprob_mean": -4.0,
            "ntf/masked_logprob_mean": sum(filtered) / 9,
        }
    )
    assert metrics["ntf/kept_logprob_mean"] < metrics["ntf/masked_logprob_mean"]  # the selection works


# -------------------------------------------------------------------------------------------------- counts
def test_keep_counts_round_before_the_ceiling():
    counts = keep_counts(torch.tensor([0, 1, 5, 9, 10, 11, 30, 100, 101]), 0.1)
    assert counts.tolist() == [1, 1, 1, 1, 1, 2, 3, 10, 11]
    assert math.ceil(0.07 * 100) == 8  # what the rounding protects against: 0.07 * 100 = 7.000000000000001
    assert keep_counts(torch.tensor([100, 50]), 0.07).tolist() == [7, 4]
    assert keep_counts(torch.tensor([7, 10]), 1.0).tolist() == [7, 10]
    assert keep_counts(torch.tensor([10]), 0.25).tolist() == [3]


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5, float("nan"), True])
def test_keep_ratio_is_validated(ratio):
    with pytest.raises(ValueError, match="keep_ratio"):
        NTFConfig(keep_ratio=ratio)
    with pytest.raises(ValueError, match="keep_ratio"):
        keep_counts(torch.tensor([10]), ratio)


def test_config_mapping_rejects_misspelt_keys():
    assert NTFConfig.from_mapping({"keep_ratio": 0.2}).keep_ratio == 0.2
    assert NTFConfig().keep_ratio == 0.1
    with pytest.raises(ValueError, match=r"Unknown option\(s\) actor_rollout_ref.actor.policy_loss.\{keep_ration\}"):
        NTFConfig.from_mapping({"keep_ration": 0.2})


# ------------------------------------------------------------------------------------------------ edge cases
def test_ties_go_to_the_earlier_position():
    old_log_prob = torch.full((1, 20), -1.0)
    old_log_prob[0, 15] = -1.0  # still a tie
    keep = keep_mask(old_log_prob, -torch.ones(1, 20), torch.ones(1, 20, dtype=torch.bool), 0.1)
    assert keep[0].nonzero().flatten().tolist() == [0, 1]


def test_short_negative_rows_keep_one_token_and_padding_rows_are_untouched():
    old_log_prob = torch.tensor([[-0.5, -0.2, -0.9, 0.0], [-1.0, -1.0, -1.0, -1.0]])
    advantages = -torch.ones(2, 4)  # junk advantages on the padding row
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]])
    keep = keep_mask(old_log_prob, advantages, mask, 0.1)
    assert keep.tolist() == [[False, False, True, True], [True] * 4]
    metrics = ntf_metrics(old_log_prob, advantages, mask, keep)
    assert metrics["ntf/neg_row_ratio"] == 1.0 and metrics["ntf/neg_token_frac"] == 1.0  # padding not counted


def test_the_sign_is_read_per_token():
    """A mixed row: positive tokens stay; a negative token stays only if it is among the row's k least likely."""
    old_log_prob = torch.tensor([[-3.0, -0.1, -2.0, -0.2, -0.3, -0.4, -0.5, -0.6, -0.7, -0.8, -0.9]])
    advantages = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0]])
    keep = keep_mask(old_log_prob, advantages, torch.ones(1, 11, dtype=torch.bool), 0.1)  # k = 2: indices 0, 2
    assert keep[0].tolist() == [True, False, True, True, True, False, False, False, False, False, False]


def test_without_negative_tokens_nothing_is_filtered_and_the_loss_is_vanilla(actor_config):
    old_log_prob = torch.randn(3, 5).clamp_max(0)
    advantages = torch.tensor([[0.0] * 5, [0.5] * 5, [0.0] * 5])
    mask = torch.ones(3, 5, dtype=torch.bool)
    keep = keep_mask(old_log_prob, advantages, mask, 0.1)
    assert keep.all()
    weights = keep_weights(keep, None, torch.float32)
    for mode in LOSS_AGG_MODES:
        assert vanilla(actor_config, old_log_prob, advantages, mask, mode, weights) == vanilla(
            actor_config, old_log_prob, advantages, mask, mode
        )
    metrics = ntf_metrics(old_log_prob, advantages, mask, keep)
    # Every key is present (verl's dp aggregation needs the same keys on every rank), 0 where undefined.
    assert metrics == dict.fromkeys(
        ["ntf/neg_token_frac", "ntf/neg_row_ratio", "ntf/kept_frac_of_neg", "ntf/kept_logprob_mean",
         "ntf/masked_logprob_mean"],
        0.0,
    )


def test_keep_ratio_one_keeps_everything():
    old_log_prob, advantages, mask = worked_example()
    assert keep_mask(old_log_prob, advantages, mask, 1.0).all()


def test_keep_weights_multiply_incoming_rollout_weights():
    keep = torch.tensor([[True, False, True]])
    weights = torch.tensor([[0.5, 2.0, 3.0]])
    assert keep_weights(keep, weights, torch.float32).tolist() == [[0.5, 0.0, 3.0]]
    assert keep_weights(keep, None, torch.bfloat16).dtype == torch.bfloat16


def test_nan_log_probs_are_an_error_at_valid_tokens_only():
    old_log_prob, advantages, mask = worked_example()
    old_log_prob[0, 7] = float("nan")  # a padding token of row 0: ignored
    keep_mask(old_log_prob, advantages, mask, 0.1)
    old_log_prob[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"old_log_prob is NaN at valid tokens of rows \[1\]"):
        keep_mask(old_log_prob, advantages, mask, 0.1)


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="must all be"):
        keep_mask(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 0.1)


# ------------------------------------------------------------------------------------------------ properties
@st.composite
def negative_batches(draw):
    rows, length = draw(st.integers(1, 6)), draw(st.integers(1, 40))
    # Few distinct values, so that ties are common.
    values = st.sampled_from([-0.01, -0.5, -1.0, -2.0, -7.5])
    old_log_prob = torch.tensor(draw(st.lists(st.lists(values, min_size=length, max_size=length), min_size=rows,
                                              max_size=rows)))
    lengths = torch.tensor(draw(st.lists(st.integers(0, length), min_size=rows, max_size=rows)))
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return old_log_prob, mask, draw(st.sampled_from([0.05, 0.1, 0.3, 1.0]))


@settings(max_examples=150, deadline=None)
@given(batch=negative_batches(), dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
def test_each_negative_row_keeps_exactly_its_k_least_likely_tokens(batch, dtype):
    old_log_prob, mask, ratio = batch
    old_log_prob = old_log_prob.to(dtype)
    keep = keep_mask(old_log_prob, -torch.ones(mask.shape), mask, ratio)
    counts = keep_counts(mask.sum(-1), ratio)
    for row in range(mask.shape[0]):
        valid = mask[row]
        kept, filtered = keep[row] & valid, ~keep[row] & valid
        assert keep[row][~valid].all()
        assert kept.sum() == min(int(counts[row]), int(valid.sum()))
        if kept.any() and filtered.any():
            kept_max = old_log_prob[row][kept].max()
            filtered_min = old_log_prob[row][filtered].min()
            assert kept_max <= filtered_min
            if kept_max == filtered_min:  # a tie at the cut goes to the earlier position
                at_cut = old_log_prob[row] == kept_max
                assert (kept & at_cut).nonzero().max() < (filtered & at_cut).nonzero().min()


@settings(max_examples=60, deadline=None)
@given(batch=negative_batches(), seed=st.integers(0, 2**31 - 1))
def test_permuting_rows_permutes_the_mask(batch, seed):
    old_log_prob, mask, ratio = batch
    advantages = torch.where(torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed)) < 0.7, -1.0, 1.0)
    order = torch.randperm(mask.shape[0], generator=torch.Generator().manual_seed(seed))
    keep = keep_mask(old_log_prob, advantages, mask, ratio)
    assert torch.equal(keep_mask(old_log_prob[order], advantages[order], mask[order], ratio), keep[order])
