"""The start-time advisor (issue 29, point 6): the visits arithmetic, its warning on verl's real config, and its
metrics in both trainers' advantage steps.

The arithmetic (``bv_blend.history.visits``) on hand-computed cases; the advice through ``advisor.advise_trainer``,
the entry the trainer hooks call, on configs composed as ``main_ppo`` composes them, at the paper's scale (45,000
prompts, 16 prompts x 8 rollouts, 500 steps: V = 0.18); verl's real legacy ``RayPPOTrainer`` constructor (which has
its training set when ``__init__`` returns) and V1 ``PPOTrainerSync`` constructor (which builds it later, in
``init()``, so its first advantage step advises), patched by the plugin.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

from bv_blend.history.visits import (
    epoch_history_share,
    independent_batches_history_share,
    plan_visits,
    planned_steps,
    visits_per_prompt,
)
from bv_blend.verl import advisor, hooks
from bv_blend.verl.hooks import METRICS_KEY
from tests.verl._helpers import compose_config, step_dataproto, step_rows

ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")
trainer_sync = pytest.importorskip("verl.trainer.ppo.v1.trainer_sync")

PAPER_PROMPTS = 45_000
PAPER = ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=8", "trainer.total_training_steps=500",
         "trainer.total_epochs=100"]  # fmt: skip
SPO = ["algorithm.adv_estimator=spo"]
PROMPT_AND_CLUSTER = ["algorithm.bv_blend.num_clusters=4", "algorithm.bv_blend.history_level=prompt_and_cluster"]
LOGGER = advisor.__name__


def _advise(overrides: list[str], prompts: int = PAPER_PROMPTS, caplog=None):
    """The hooks' entry on a trainer holding the composed config and a training set of ``prompts`` rows; the
    advisor's warnings."""
    trainer = SimpleNamespace(config=compose_config(overrides), train_dataset=range(prompts))
    advice = advisor.advise_trainer(trainer)
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING] if caplog else []
    return advice, warnings


# ------------------------------------------------------------------------------------------- arithmetic
def test_under_an_epoch_no_row_sees_its_prompts_history():
    """Within the first epoch every visit is a prompt's first (verl's sampler draws without replacement)."""
    assert epoch_history_share(PAPER_PROMPTS, 16, 500) == 0.0
    assert epoch_history_share(100, 10, 10) == 0.0  # exactly one epoch
    assert visits_per_prompt(PAPER_PROMPTS, 16, 500) == pytest.approx(8000 / 45000)  # 0.178


def test_four_epochs_give_three_quarters_of_the_rows_a_history():
    """E whole epochs: 1 - 1/E of the visits are revisits (4 epochs: 0.75)."""
    assert planned_steps(100, 10, total_epochs=4) == 40
    assert epoch_history_share(100, 10, 40) == 0.75
    assert epoch_history_share(100, 10, 20) == 0.5
    assert visits_per_prompt(100, 10, 40) == 4.0


def test_planned_steps_stop_at_whichever_comes_first():
    """verl's loop ends at total_training_steps or after total_epochs epochs of N // B steps, whichever is first."""
    assert planned_steps(PAPER_PROMPTS, 16, total_epochs=100, total_training_steps=500) == 500
    assert planned_steps(100, 10, total_epochs=2, total_training_steps=500) == 20
    assert planned_steps(105, 10, total_epochs=3) == 30  # the partial batch is dropped


def test_the_history_sampler_share_follows_independent_uniform_batches():
    """N=4, B=2, s=2 by hand: a prompt is missed by both batches with (1/2)^2, so 3 distinct of D=4 draws, share
    0.25; and the formula matches a simulation of independent uniform batches of distinct prompts."""
    assert independent_batches_history_share(4, 2, 2) == pytest.approx(0.25)
    rng = np.random.default_rng(0)
    prompts, batch, steps, runs = 50, 5, 20, 4000
    drawn = np.argsort(rng.random((runs, steps, prompts)), axis=2)[:, :, :batch].reshape(runs, -1)
    distinct = np.array([len(np.unique(row)) for row in drawn])
    simulated = 1.0 - distinct.mean() / (steps * batch)
    assert independent_batches_history_share(prompts, batch, steps) == pytest.approx(simulated, abs=0.005)
    # at 4 epochs' worth of steps a little above verl's epochs: some prompts come back early, others not at all
    assert independent_batches_history_share(100, 10, 40) == pytest.approx(1 - 100 * (1 - 0.9**40) / 400)
    assert independent_batches_history_share(100, 10, 40) > epoch_history_share(100, 10, 40)


def test_priors_give_every_row_a_history():
    """With priors each prompt has a history before its first visit: share 1, whatever the sampling."""
    assert plan_visits(PAPER_PROMPTS, 16, 500, priors=True).history_row_share == 1.0
    assert plan_visits(PAPER_PROMPTS, 16, 500, history_sampler=True, priors=True).history_row_share == 1.0
    assert plan_visits(PAPER_PROMPTS, 16, 500).history_row_share == 0.0


# ------------------------------------------------------------------------------------- verl's config path
@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        (SPO, "Settings that would act: priors: `bv-blend priors`, then algorithm.spo.offline_values=PATH"),
        (PROMPT_AND_CLUSTER, "Settings that would act: algorithm.bv_blend.history_level=cluster (the cluster's "
                             "history acts on every row whose cluster was seen); or priors: `bv-blend priors`, then "
                             "algorithm.bv_blend.prior_file=PATH"),
        (["algorithm.bv_blend.history_level=prompt"], "algorithm.bv_blend.history_level=cluster or "
                                                      "algorithm.bv_blend.history_level=prompt_and_cluster"),
    ],
)  # fmt: skip
def test_the_paper_scale_warns_where_a_prompt_history_acts_on_few_rows(caplog, overrides, fix):
    """45,000 prompts, 16 x 8, 500 steps: V = 0.18, share 0. SPO and BV-Blend's prompt levels get one warning with
    the numbers and the settings that would act."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise([*PAPER, *overrides], caplog=caplog)
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    message = warnings[0].getMessage()
    for part in ("45000 training prompts", "16 prompts a step x 8 rollouts", "500 steps", "0.18 expected visits per "
                 "prompt (verl's sampler", "a share of 0.00 of the rows", fix, "This is a warning"):  # fmt: skip
        assert part in message, part
    assert advice.metrics() == {"advisor/visits_per_prompt": pytest.approx(8000 / 45000),
                                "advisor/prompt_history_row_share": 0.0}  # fmt: skip


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.bv_blend.num_clusters=4"],  # the default cluster level keeps no prompt history
        [*SPO, "+algorithm.spo.offline_values=priors.json"],
        [*PROMPT_AND_CLUSTER, "algorithm.bv_blend.prior_file=priors.json"],
    ],
)
def test_no_warning_at_the_cluster_level_or_with_priors(caplog, overrides):
    """The warning is about prompt-level histories: none at the cluster level (its metrics still report the
    prompt-level share), none with priors (every row has a history: share 1)."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise([*PAPER, *overrides], caplog=caplog)
    assert warnings == []
    priors = any("prior" in o or "offline_values" in o for o in overrides)
    assert advice.metrics()["advisor/prompt_history_row_share"] == (1.0 if priors else 0.0)
    assert advice.metrics()["advisor/visits_per_prompt"] == pytest.approx(8000 / 45000)


def test_the_history_sampler_is_planned_as_independent_batches(caplog):
    """With data.history_sampler.enable the share is the independent batches' (0.084 at the paper's scale), and the
    warning says so."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise([*PAPER, *SPO, "data.history_sampler.enable=true"], caplog=caplog)
    expected = 1 - 45000 * (1 - (1 - 16 / 45000) ** 500) / 8000
    assert advice.visits.history_row_share == pytest.approx(expected) and 0.08 < expected < 0.09
    assert len(warnings) == 1 and "a share of 0.08 of the rows" in warnings[0].getMessage()
    assert "the history sampler's independent batches" in warnings[0].getMessage()


@pytest.mark.parametrize(("steps", "warns"), [(39, True), (40, False)])
def test_the_threshold_is_three_quarters_of_the_rows(caplog, steps, warns):
    """100 prompts, 10 a step: 39 steps (V = 3.9, share 0.744) warn, 40 steps (V = 4, share 0.75) do not."""
    overrides = [*SPO, "data.train_batch_size=10", f"trainer.total_training_steps={steps}", "trainer.total_epochs=5"]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise(overrides, prompts=100, caplog=caplog)
    assert advice.visits.history_row_share == pytest.approx(1 - 100 / (steps * 10))
    assert bool(warnings) is warns


def test_a_run_it_cannot_read_or_without_a_prompt_history_is_not_advised(caplog):
    """Advice only: no training set, a training set without a length, or an estimator that keeps no per-prompt
    history give no advice, no metrics, no warning and no error."""

    class NoLength:
        def __len__(self):
            raise TypeError("no length")

    config = compose_config([*PAPER, *SPO])
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert advisor.advise_trainer(SimpleNamespace(config=config)) is None
        assert advisor.advise_trainer(SimpleNamespace(config=config, train_dataset=NoLength())) is None
        assert advisor.step_metrics(SimpleNamespace(config=config, train_dataset=NoLength())) == {}
        for other in ("grpo", "ha_dw"):
            trainer = SimpleNamespace(config=compose_config([*PAPER, f"algorithm.adv_estimator={other}"]),
                                      train_dataset=range(PAPER_PROMPTS))  # fmt: skip
            assert advisor.advise_trainer(trainer) is None and advisor.step_metrics(trainer) == {}
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


# ------------------------------------------------------------------------------------------ the trainers
def test_the_legacy_trainer_warns_at_start_and_logs_the_metrics_every_step(caplog):
    """verl's real RayPPOTrainer constructor (its training set given, as verl's task runner gives it): the
    trainer-start check passes and the advisor warns once, with verl's own step count; each legacy advantage step
    carries the advisor's metrics to verl's step metrics."""
    config = compose_config([*PAPER, *SPO, "trainer.use_v1=false"])
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        trainer = ray_trainer.RayPPOTrainer(config, None, {ray_trainer.Role.ActorRollout: object}, None,
                                            train_dataset=list(range(PAPER_PROMPTS)), val_dataset=[0, 1])  # fmt: skip
        for step in range(2):
            batch = ray_trainer.compute_advantage(step_dataproto(step_rows(step)), adv_estimator="spo",
                                                  config=config.algorithm)  # fmt: skip
            metrics = batch.meta_info[METRICS_KEY]
            assert metrics["advisor/visits_per_prompt"] == pytest.approx(8000 / 45000)
            assert metrics["advisor/prompt_history_row_share"] == 0.0
            assert "spo/p_hat_mean" in metrics  # beside the estimator's own
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "0.18 expected visits per prompt" in warnings[0].getMessage()
    assert advisor.advise_trainer(trainer).visits.steps == trainer.total_training_steps == 500


def test_the_v1_trainer_advises_at_its_first_advantage_step(caplog):
    """verl's real PPOTrainerSync constructor passes the trainer-start check and has no training set yet (no
    advice); once verl's init() has built it, the V1 advantage-step hook warns once and adds the advisor's metrics to
    the step's metrics at every step (verl's own step is stubbed: it needs TransferQueue and workers)."""
    config = compose_config([*PAPER, *PROMPT_AND_CLUSTER])
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        trainer = trainer_sync.PPOTrainerSync(config)
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
        trainer.train_dataset = range(PAPER_PROMPTS)  # what verl's init() -> _init_dataloader() sets
        step = hooks._v1_compute_advantage(lambda self, batch, metrics: None)
        for _ in range(2):
            metrics: dict[str, float] = {}
            step(trainer, SimpleNamespace(keys=[], partition_id="train"), metrics)
            assert metrics["advisor/visits_per_prompt"] == pytest.approx(8000 / 45000)
            assert metrics["advisor/prompt_history_row_share"] == 0.0
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "BV-Blend (algorithm.bv_blend.history_level=prompt_and_cluster)" in warnings[0].getMessage()


# ------------------------------------------------------------------------------- the recommended config (issue 37)
def test_the_recommended_n2_config_is_the_measured_cluster_arm_and_is_not_warned_on(caplog):
    """``--config-name paper/bv_blend_n2``, composed as verl's main_ppo composes it (verl's config module, ours found
    through the search-path plugin): BV-Blend's cluster level, the arm every instrument measured at n = 2, and at the
    paper's 45,000 prompts (0.71 visits per prompt) the start-time advisor has nothing to warn about. Its priors and
    sampler variants keep the prompt_and_cluster level they were measured at."""
    from bv_blend.paper.configs import compose_paper_config

    config = compose_paper_config("bv_blend_n2")
    assert config.algorithm.adv_estimator == "bv_blend"
    assert config.algorithm.bv_blend.history_level == "cluster"
    assert (config.data.train_batch_size, config.actor_rollout_ref.rollout.n) == (64, 2)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice = advisor.advise_trainer(SimpleNamespace(config=config, train_dataset=range(PAPER_PROMPTS)))
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert advice.level == "algorithm.bv_blend.history_level=cluster" and not advice.acts_per_prompt
    assert advice.visits.visits_per_prompt == pytest.approx(64 * 500 / PAPER_PROMPTS)
    assert compose_paper_config("bv_blend_n2_sampler").algorithm.bv_blend.history_level == "prompt_and_cluster"
    priors = compose_paper_config("bv_blend_n2_priors", ["algorithm.bv_blend.prior_file=priors.json"])
    assert priors.algorithm.bv_blend.history_level == "prompt_and_cluster"
