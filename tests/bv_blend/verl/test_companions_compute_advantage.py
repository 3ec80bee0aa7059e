"""HA-DW and MaxNorm-AC through verl's own ``compute_advantage`` (legacy trainer path), not by calling our functions.

Everything is verl 0.9.1's real code on CPU: ``verl.trainer.ppo.ray_trainer.compute_advantage`` looks the estimator up
in the registry our plugin filled (``import verl`` loaded it through the entry point), ``compute_data_metrics``
moves the step's metrics (carried on the batch) into the step dict. The expected numbers are the companions spec's
worked examples.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from verl.trainer.ppo import ray_trainer

from bv_blend.verl import runtime
from bv_blend.verl.channel import current_step
from bv_blend.verl.hooks import METRICS_KEY
from tests.bv_blend.verl._companion_helpers import algorithm, group_batch, run, sequence_advantages

HARD_AND_EASY = [[1, 0, 0, 0], [1, 1, 1, 0]]
MAXNORM_TABLE = [[0.51, 0.50, 0.49, 0.50], [0.503, 0.501, 0.499, 0.500], [0.01, 0.01, 0, 0], [1, 0, 0, 0], [0.7]]


def _step_metrics(data) -> dict[str, float]:
    """What RayPPOTrainer.fit merges into the step dict after compute_advantage (the patched compute_data_metrics)."""
    data.batch["responses"] = torch.ones_like(data.batch["response_mask"])
    data.batch["prompts"] = torch.ones_like(data.batch["response_mask"])
    mask = data.batch["response_mask"]
    data.batch["attention_mask"] = torch.cat([torch.ones_like(mask), mask], dim=1)
    return ray_trainer.compute_data_metrics(batch=data, use_critic=False)


# ------------------------------------------------------------------------------------------------------ HA-DW
def test_ha_dw_worked_example_through_verl():
    """Spec section 2: lambda 1.3, a = 0.5 (the first call anchors on its own batch accuracy, 0.5), G = 4."""
    data = run("ha_dw", HARD_AND_EASY)
    expected = [2.503845, -0.506219, -0.506219, -0.506219, 0.506219, 0.506219, 0.506219, -2.503845]
    torch.testing.assert_close(sequence_advantages(data), torch.tensor(expected, dtype=torch.float64), atol=1e-6,
                               rtol=0)  # fmt: skip
    assert torch.equal(data.batch["advantages"], data.batch["returns"])
    metrics = _step_metrics(data)
    assert metrics["ha_dw/anchor"] == metrics["ha_dw/batch_acc"] == 0.5
    assert metrics["ha_dw/phi_max"] == pytest.approx(1.3 * math.exp(0.25))
    assert metrics["ha_dw/phi_min"] == pytest.approx(1.3 * math.exp(-0.25))
    assert metrics["ha_dw/hard_group_ratio"] == metrics["ha_dw/easy_group_ratio"] == 0.5
    assert metrics["ha_dw/abs_advantage_max"] == pytest.approx(2.503845, abs=1e-6)
    assert "ha_dw/eta" not in metrics  # window mode has no gain
    assert "critic/advantages/mean" in metrics  # verl's own metrics are still there


@pytest.mark.parametrize("norm", [True, False])
def test_ha_dw_is_verls_grpo_times_phi(norm):
    """Per row, HA-DW / verl's grpo (or Dr.GRPO with norm_adv_by_std_in_grpo=false) is Phi = 1.3 e^(+-0.25)."""
    weighted = sequence_advantages(run("ha_dw", HARD_AND_EASY, algorithm("ha_dw", norm=norm)))
    grpo = sequence_advantages(run("grpo", HARD_AND_EASY, algorithm("grpo", norm=norm)))
    up, down = 1.3 * math.exp(0.25), 1.3 * math.exp(-0.25)
    phi = torch.tensor([up, down, down, down, down, down, down, up], dtype=torch.float64)
    torch.testing.assert_close(weighted, grpo * phi, rtol=1e-12, atol=0)
    assert (grpo[0] == 0.75) == (not norm)  # Dr.GRPO's R - mean, or GRPO's standardised value


def test_ha_dw_kalman_worked_example_through_verl():
    """Stored C+ = [0.3, 0.5], y = 0.3: sigma = 0.1, eta = 0.1, C+ = 0.48; the call anchors on C- = 0.5."""
    config = algorithm("ha_dw", mode="kalman")
    estimator = runtime.estimator_for("ha_dw", config)
    estimator.load_state_dict({**estimator.state_dict(), "history": torch.tensor([0.3, 0.5], dtype=torch.float64),
                               "num_updates": 2})  # fmt: skip
    metrics = _step_metrics(run("ha_dw", [[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], config))
    assert metrics["ha_dw/anchor"] == 0.5 and metrics["ha_dw/batch_acc"] == pytest.approx(0.3)
    assert metrics["ha_dw/eta"] == pytest.approx(0.1)
    assert estimator.history[-1] == pytest.approx(0.48) and estimator.num_updates == 3


def test_ha_dw_singletons_keep_grpos_value_and_all_equal_groups_stay_zero():
    groups = [[1], [0], [1, 1, 1], [0, 0], [1, 0]]
    weighted = sequence_advantages(run("ha_dw", groups))
    grpo = sequence_advantages(run("grpo", groups))
    # verl's singleton std is a float32 tensor(1.0), so its 1 + eps is rounded to float32: 5e-8 apart.
    torch.testing.assert_close(weighted[:2], grpo[:2], atol=1e-7, rtol=0)
    assert weighted[0] == 1 / (1 + 1e-6)
    assert weighted[2:7].abs().sum() == 0
    assert weighted[7] != grpo[7] and torch.sign(weighted[7:]).tolist() == torch.sign(grpo[7:]).tolist()
    assert runtime.estimator_for("ha_dw", algorithm("ha_dw")).history.tolist() == [5 / 9]  # every valid row counts in y


# ------------------------------------------------------------------------------------------------- MaxNorm-AC
def test_maxnorm_worked_table_through_verl():
    """Spec section 3 (delta = tau = 0.01): resolved, jitter (skipped), floor binds, [1,0,0,0], singleton."""
    data = run("maxnorm_ac", MAXNORM_TABLE)
    expected = [1, 0, -1, 0] + [0] * 4 + [2 / 3, 2 / 3, -2 / 3, -2 / 3] + [1, -1 / 3, -1 / 3, -1 / 3] + [0]
    torch.testing.assert_close(sequence_advantages(data), torch.tensor(expected, dtype=torch.float64), atol=1e-9,
                               rtol=0)  # fmt: skip
    metrics = _step_metrics(data)
    assert metrics["maxnorm/skipped_group_ratio"] == pytest.approx(2 / 5)  # jitter + singleton
    assert metrics["maxnorm/floor_active_ratio"] == pytest.approx(1 / 3)
    assert metrics["maxnorm/abs_advantage_max"] == pytest.approx(1.0)
    assert metrics["maxnorm/binning_changed_ratio"] > 0  # the jitter rows moved onto the grid


def test_maxnorm_table_against_verls_own_estimators():
    """The spec's "verl for comparison" column, computed by verl: grpo amplifies the jitter, rloo stays tiny."""
    grpo = sequence_advantages(run("grpo", MAXNORM_TABLE[:2]))
    rloo = sequence_advantages(run("rloo", MAXNORM_TABLE[:2]))
    torch.testing.assert_close(grpo[:4], torch.tensor([1.2246, 0, -1.2246, 0], dtype=torch.float64), atol=1e-4,
                               rtol=0)  # fmt: skip
    torch.testing.assert_close(grpo[4:], torch.tensor([1.3167, 0.1463, -1.0241, -0.4389], dtype=torch.float64),
                               atol=1e-4, rtol=0)  # fmt: skip
    torch.testing.assert_close(rloo[:4], torch.tensor([0.0133, 0, -0.0133, 0], dtype=torch.float64), atol=1e-4,
                               rtol=0)  # fmt: skip
    ours = sequence_advantages(run("maxnorm_ac", MAXNORM_TABLE[:2]))
    assert ours[4:].abs().sum() == 0 and ours.abs().max() == 1


def test_maxnorm_centered_numerator_differs_only_where_the_floor_binds():
    centred = sequence_advantages(run("maxnorm_ac", MAXNORM_TABLE, algorithm("maxnorm_ac", numerator="centered")))
    rloo = sequence_advantages(run("maxnorm_ac", MAXNORM_TABLE))
    torch.testing.assert_close(centred[8:12], torch.tensor([0.5, 0.5, -0.5, -0.5], dtype=torch.float64))
    assert torch.equal(torch.cat([centred[:8], centred[12:]]), torch.cat([rloo[:8], rloo[12:]]))


# ------------------------------------------------------------------------------------------ shared edge cases
@pytest.mark.parametrize("estimator", ["ha_dw", "maxnorm_ac"])
def test_padding_rows_get_zero_and_change_nothing(estimator):
    """verl's synthetic rows (uid 'pad...', empty mask, here with NaN rewards) are inert."""
    with_pad = run(estimator, HARD_AND_EASY + [[0.5, 0.25]], pad_rows=3)
    metrics_with_pad = with_pad.meta_info[METRICS_KEY]
    hadw = runtime.estimator_for("ha_dw", algorithm("ha_dw")) if estimator == "ha_dw" else None
    history_with_pad = hadw.history.copy() if hadw is not None else None
    runtime.reset()
    without = run(estimator, HARD_AND_EASY + [[0.5, 0.25]])
    assert torch.equal(with_pad.batch["advantages"][:10], without.batch["advantages"])
    assert with_pad.batch["advantages"][10:].abs().sum() == 0
    assert without.meta_info[METRICS_KEY] == metrics_with_pad
    if estimator == "ha_dw":
        assert np.array_equal(runtime.estimator_for("ha_dw", algorithm("ha_dw")).history, history_with_pad)


@pytest.mark.parametrize(
    ("estimator", "bad", "section"),
    [("ha_dw", 1.5, "algorithm.ha_dw"), ("ha_dw", float("nan"), None), ("maxnorm_ac", -0.2, "algorithm.maxnorm")],
)
def test_rewards_outside_the_range_are_a_clear_error_and_change_nothing(estimator, bad, section):
    run(estimator, HARD_AND_EASY)
    process = runtime.estimator_for(estimator, algorithm(estimator))
    before = (process.state_dict(), dict(process.metrics)) if estimator == "ha_dw" else dict(process.metrics)
    with pytest.raises(ValueError, match=f"{section}.reward_range" if section else "must be finite") as error:
        run(estimator, [[1, 0, bad, 0]])
    assert "rows [2]" in str(error.value)
    if estimator == "ha_dw":
        state, metrics = before
        after = process.state_dict()
        assert torch.equal(after["history"], state["history"]) and after["num_updates"] == state["num_updates"] == 1
        assert process.metrics == metrics
    else:
        assert process.metrics == before
    assert current_step() is None  # the failed call's channel closed with it


def test_wider_declared_range_accepts_the_rewards():
    config = algorithm("maxnorm_ac", reward_range=[0, 10], delta_res=0.1)
    advantages = sequence_advantages(run("maxnorm_ac", [[10, 0, 0, 0]], config))
    torch.testing.assert_close(advantages, torch.tensor([1, -1 / 3, -1 / 3, -1 / 3], dtype=torch.float64))


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (algorithm("ha_dw", lamda_scale=1.5), r"Unknown option\(s\) algorithm.ha_dw.\{lamda_scale\}"),
        (algorithm("ha_dw", norm_adv_by_std=False), "algorithm.norm_adv_by_std_in_grpo"),
        (algorithm("ha_dw", window=0), r"algorithm.ha_dw.window=0 is invalid"),
        (algorithm("ha_dw", allow_state_reset="yes"), "allow_state_reset='yes' is invalid"),
        (algorithm("maxnorm_ac", delta=0.01), r"Unknown option\(s\) algorithm.maxnorm.\{delta\}"),
        (algorithm("maxnorm_ac", numerator="grpo"), "must be one of rloo, centered"),
    ],
)
def test_bad_options_are_clear_errors(config, match):
    with pytest.raises(ValueError, match=match):
        ray_trainer.compute_advantage(group_batch(HARD_AND_EASY), adv_estimator=config.adv_estimator, config=config)


def test_other_estimators_run_verls_code_and_keep_no_companion_state():
    grpo = run("grpo", HARD_AND_EASY)
    original = ray_trainer.compute_advantage.__wrapped__(
        group_batch(HARD_AND_EASY), adv_estimator="grpo", config=algorithm("grpo")
    )
    assert torch.equal(grpo.batch["advantages"], original.batch["advantages"])
    assert runtime.held("ha_dw") is None and runtime.held("maxnorm_ac") is None
    assert METRICS_KEY not in grpo.meta_info
