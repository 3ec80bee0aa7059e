"""The registered ``ntf`` loss through verl's own loss call, ``ppo_loss`` (verl/workers/utils/losses.py).

The actor config is built the way verl's workers build it: ``omega_conf_to_dataclass`` on the ``actor`` node of a
composed config, here ``configs/paper/bv_blend_ntf.yaml``, whose ``policy_loss._target_`` is our
``NTFPolicyLossConfig``. ``ppo_loss`` then resolves ``loss_mode=ntf`` in verl's policy-loss registry (filled by our
plugin) and aggregates with verl's ``agg_loss``. The model output is laid out as verl's engine hands it over: one
flat row of log-probs per sequence (prompt + response), sliced back to the responses by ``no_padding_2_padding``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.utils import losses

from bv_blend.paper.configs import compose_paper_config
from bv_blend.verl.glue.ntf import NTFPolicyLossConfig

DATA = ["data.train_files=[train.parquet]", "data.val_files=[val.parquet]"]
PROMPT_LEN = 3
ROW1_LOGPROBS = [-0.1, -2.3, -0.05, -4.0, -0.2, -0.3, -1.0, -0.01, -0.5, -0.7]
# The spec's worked example (ratio 1, dp = 1): NTF's loss and vanilla's, under every loss_agg_mode.
EXPECTED = {
    "token-mean": (-3 / 14, 6 / 14),  # the spec's -0.214286 and 0.428571: the denominator stays 14
    "token-sum": (-3.0, 6.0),
    "seq-mean-token-sum": (-1.5, 3.0),
    "seq-mean-token-mean": ((-1 + 1 / 10) / 2, 0.0),  # row 1 keeps its 10-token denominator
    "seq-mean-token-sum-norm": (-1.5 / 10, 3.0 / 10),  # horizon T = 10
}


@pytest.fixture(scope="module")
def composed():
    return compose_paper_config("bv_blend_ntf", DATA)


def actor_config(composed, mode: str = "token-mean", **policy_loss):
    """verl's ActorConfig, instantiated from the composed actor node exactly as the workers do."""
    node = copy.deepcopy(composed.actor_rollout_ref.actor)
    node.loss_agg_mode = mode
    for key, value in policy_loss.items():
        OmegaConf.update(node, f"policy_loss.{key}", value, force_add=True)
    return omega_conf_to_dataclass(node)


def worked_example(pad_row: bool = False):
    """Row 0: A = +1 on 4 tokens; row 1: A = -1 on 10 tokens with the spec's old log-probs; optionally a padding
    row (empty response)."""
    old = torch.tensor([[-0.3, -0.6, -0.2, -0.9] + [0.0] * 6, ROW1_LOGPROBS])
    advantages = torch.tensor([[1.0] * 4 + [0.0] * 6, [-1.0] * 10])
    mask = torch.tensor([[1] * 4 + [0] * 6, [1] * 10])
    if pad_row:
        old, advantages = torch.cat([old, torch.zeros(1, 10)]), torch.cat([advantages, torch.zeros(1, 10)])
        mask = torch.cat([mask, torch.zeros(1, 10, dtype=torch.int64)])
    return old, advantages, mask


def call_ppo_loss(config, old, advantages, mask, log_prob=None, rollout_is_weights=None, batch_num_tokens=None):
    """verl's ppo_loss on padded tensors, dp = 1; ``log_prob`` defaults to ``old`` (ratio 1, the first epoch)."""
    log_prob = old.clone() if log_prob is None else log_prob
    rows, length = mask.shape
    flat = []  # model output: one flat row per sequence, response log-probs shifted left by one token
    for i in range(rows):
        n = int(mask[i].sum())
        flat += [torch.zeros(PROMPT_LEN - 1), log_prob[i, :n], torch.zeros(1)]
    fields = {
        "prompts": torch.ones(rows, PROMPT_LEN, dtype=torch.int64),
        "responses": torch.ones(rows, length, dtype=torch.int64),
        "attention_mask": torch.cat([torch.ones(rows, PROMPT_LEN, dtype=torch.int64), mask], dim=1),
        "response_mask": mask,
        "old_log_probs": old,
        "advantages": advantages,
    }
    if rollout_is_weights is not None:
        fields["rollout_is_weights"] = rollout_is_weights
    data = TensorDict(fields, batch_size=rows)
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=batch_num_tokens, global_batch_size=None)
    loss, metrics = losses.ppo_loss(config, {"log_probs": torch.cat(flat)}, data)
    return loss, metrics


def test_the_composed_config_instantiates_our_policy_loss_config(composed):
    config = actor_config(composed)
    assert type(config.policy_loss) is NTFPolicyLossConfig
    assert config.policy_loss.loss_mode == "ntf" and config.policy_loss.ntf_keep_ratio == 0.1


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_filtered_tokens_add_zero_and_keep_their_place_in_every_denominator(composed, mode):
    ntf, plain = EXPECTED[mode]
    old, advantages, mask = worked_example()
    loss, _ = call_ppo_loss(actor_config(composed, mode), old, advantages, mask)
    assert loss.item() == pytest.approx(ntf, abs=1e-6)
    vanilla = actor_config(composed, mode, loss_mode="vanilla", ntf_keep_ratio=None)
    assert call_ppo_loss(vanilla, old, advantages, mask)[0].item() == pytest.approx(plain, abs=1e-6)
    # A padding row (empty response) changes nothing: nothing to filter, no place in any denominator.
    with_pad = call_ppo_loss(actor_config(composed, mode), *worked_example(pad_row=True))[0]
    assert with_pad.item() == pytest.approx(ntf, abs=1e-6)


def test_global_token_count_is_the_denominator(composed):
    """verl fixes token-mean's denominator to the mini-batch's token count before the loss runs: NTF keeps it."""
    old, advantages, mask = worked_example()
    loss, _ = call_ppo_loss(actor_config(composed), old, advantages, mask, batch_num_tokens=28)
    assert loss.item() == pytest.approx(-3 / 28, abs=1e-6)


def test_filtered_tokens_get_no_gradient(composed):
    old, advantages, mask = worked_example()
    log_prob = old.clone().requires_grad_(True)
    loss, _ = call_ppo_loss(actor_config(composed), old, advantages, mask, log_prob=log_prob)
    loss.backward()
    grad = log_prob.grad
    assert (grad[0, :4] != 0).all()  # the positive row is untouched
    assert grad[1].nonzero().flatten().tolist() == [3]  # only the least likely negative token (log-prob -4.0)


def test_metrics_are_the_specs_and_verls(composed):
    old, advantages, mask = worked_example()
    _, metrics = call_ppo_loss(actor_config(composed), old, advantages, mask)
    values = {name: metric.aggregate() for name, metric in metrics.items() if name.startswith("ntf/")}
    filtered = [lp for i, lp in enumerate(ROW1_LOGPROBS) if i != 3]
    assert values == pytest.approx(
        {
            "ntf/neg_token_frac": 10 / 14,
            "ntf/neg_row_ratio": 1 / 2,
            "ntf/kept_frac_of_neg": 1 / 10,
            "ntf/kept_logprob_mean": -4.0,
            "ntf/masked_logprob_mean": sum(filtered) / 9,
        }
    )
    assert {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl"} <= set(metrics)


def test_rollout_correction_weights_multiply_the_keep_mask(composed):
    old, advantages, mask = worked_example()
    weights = torch.full(mask.shape, 0.5)
    loss, _ = call_ppo_loss(actor_config(composed), old, advantages, mask, rollout_is_weights=weights)
    assert loss.item() == pytest.approx(-3 / 28, abs=1e-6)


def test_keep_ratio_comes_from_the_config(composed):
    old, advantages, mask = worked_example()
    everything = call_ppo_loss(actor_config(composed, ntf_keep_ratio=1.0), old, advantages, mask)[0]
    vanilla = call_ppo_loss(actor_config(composed, loss_mode="vanilla", ntf_keep_ratio=None), old, advantages, mask)[0]
    assert torch.equal(everything, vanilla)
    # Three tokens of row 1 (ceil(0.3 * 10)): -4.0, -2.3, -1.0.
    three = call_ppo_loss(actor_config(composed, ntf_keep_ratio=0.3), old, advantages, mask)[0]
    assert three.item() == pytest.approx((-4 + 3) / 14, abs=1e-6)


def test_stock_policy_loss_config_runs_ntf_at_the_default_ratio():
    """loss_mode=ntf on verl's plain PolicyLossConfig (no _target_ change) runs with the paper's 0.1."""
    composed = compose_paper_config("qwen25_math_7b", [*DATA, "actor_rollout_ref.actor.policy_loss.loss_mode=ntf"])
    config = omega_conf_to_dataclass(composed.actor_rollout_ref.actor)
    assert type(config.policy_loss).__name__ == "PolicyLossConfig"
    loss, _ = call_ppo_loss(config, *worked_example())
    assert loss.item() == pytest.approx(-3 / 14, abs=1e-6)


@pytest.mark.parametrize(
    ("policy_loss", "match"),
    [
        ({"ntf_keep_ratoi": 0.2}, "unexpected keyword argument 'ntf_keep_ratoi'"),
        ({"ntf_keep_ratio": 0.0}, r"ntf_keep_ratio=0.0 is invalid: it must be in \(0, 1\]"),
        ({"ntf_keep_ratio": "ten"}, "ntf_keep_ratio='ten' is invalid"),
        ({"loss_mode": "vanilla"}, "ntf_keep_ratio=0.1 is set but .*loss_mode='vanilla'"),
    ],
)
def test_bad_policy_loss_options_fail_where_verl_builds_the_config(composed, policy_loss, match):
    from hydra.errors import InstantiationException

    with pytest.raises(InstantiationException, match=match):
        actor_config(composed, **policy_loss)
