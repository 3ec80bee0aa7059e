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
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from verl.trainer.ppo import ray_trainer

from bv_blend.history.keys import prompt_key
from bv_blend.history.priors import write_priors
from bv_blend.history.visits import (
    epoch_history_share,
    independent_batches_history_share,
    plan_visits,
    planned_steps,
    visits_per_prompt,
)
from bv_blend.verl import advisor
from bv_blend.verl.hooks import METRICS_KEY
from tests.bv_blend.verl._helpers import (
    PAPER,
    PAPER_PROMPTS,
    PROMPT_AND_CLUSTER,
    compose_config,
    step_dataproto,
    step_rows,
)

SPO = ["algorithm.adv_estimator=spo"]
LOGGER = advisor.__name__


def chat(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"problem {i}"}]


def rl_dataset(folder, prompts: int, start: int = 0):
    """verl's own RLHFDataset over a parquet of ``prompts`` chat prompts (``extra_info.index`` = their number), as
    the trainers build it (no tokenizer is needed without the overlong-prompt filter)."""
    import pandas as pd
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    path = folder / f"train_{start}_{prompts}.parquet"
    numbers = range(start, start + prompts)
    pd.DataFrame({"prompt": [chat(i) for i in numbers], "extra_info": [{"index": i} for i in numbers],
                  "data_source": ["test"] * prompts}).to_parquet(path)  # fmt: skip
    return RLHFDataset(str(path), tokenizer=None,
                       config=OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(folder)}))


def text_keys(numbers) -> list[str]:
    """The prompts' keys as a run without prompt_key_field keys them (the hash of the prompt's text)."""
    return [prompt_key(chat(i)) for i in numbers]


def write_prior_file(path, keys) -> str:
    write_priors(path, {key: [0.0, 1.0] for key in keys})
    return str(path)


def _advise(overrides: list[str], prompts: int = PAPER_PROMPTS, caplog=None, dataset=None):
    """The hooks' entry on a trainer holding the composed config and a training set of ``prompts`` rows (or
    ``dataset``); the advisor's warnings."""
    trainer = SimpleNamespace(config=compose_config(overrides),
                              train_dataset=range(prompts) if dataset is None else dataset)  # fmt: skip
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
    named = re.search(r"what to run there: (\S+)\.", message)  # the measured guidance, a file of this repository
    assert named and (Path(__file__).parents[3] / named.group(1)).is_file(), message
    assert advice.metrics() == {"advisor/visits_per_prompt": pytest.approx(8000 / 45000),
                                "advisor/prompt_history_row_share": 0.0}  # fmt: skip


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.bv_blend.num_clusters=4"],  # the default cluster level keeps no prompt history
        [*SPO, "+algorithm.spo.offline_values={priors}"],
        [*PROMPT_AND_CLUSTER, "algorithm.bv_blend.prior_file={priors}"],
    ],
)
def test_no_warning_at_the_cluster_level_or_with_priors(caplog, tmp_path, overrides):
    """The warning is about prompt-level histories: none at the cluster level (its metrics still report the
    prompt-level share), none with a prior file that holds every training prompt (share 1)."""
    dataset = rl_dataset(tmp_path, PAPER_PROMPTS)
    priors = write_prior_file(tmp_path / "priors.json", text_keys(range(PAPER_PROMPTS)))
    overrides = [o.format(priors=priors) for o in overrides]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise([*PAPER, *overrides], dataset=dataset, caplog=caplog)
    assert warnings == []
    with_priors = any("prior" in o or "offline_values" in o for o in overrides)
    assert advice.metrics()["advisor/prompt_history_row_share"] == (1.0 if with_priors else 0.0)
    assert advice.metrics()["advisor/visits_per_prompt"] == pytest.approx(8000 / 45000)
    assert advice.prior_covered == (PAPER_PROMPTS if with_priors else None)


def test_the_history_sampler_is_planned_as_independent_batches(caplog):
    """With data.history_sampler.enable the share is the independent batches' (0.084 at the paper's scale), and the
    warning says so."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise([*PAPER, *SPO, "data.history_sampler.enable=true"], caplog=caplog)
    expected = 1 - 45000 * (1 - (1 - 16 / 45000) ** 500) / 8000
    assert advice.visits.history_row_share == pytest.approx(expected) and 0.08 < expected < 0.09
    assert len(warnings) == 1 and "a share of 0.08 of the rows" in warnings[0].getMessage()
    assert "the history sampler's independent batches" in warnings[0].getMessage()


def test_the_history_samplers_epoch_mode_is_planned_as_epochs(caplog):
    """data.history_sampler.epoch_without_replacement draws each prompt once an epoch: at the paper's scale no prompt
    comes back (share 0), as with verl's sampler, not the independent batches' 0.084."""
    sampler = ["data.history_sampler.enable=true", "data.history_sampler.epoch_without_replacement=true"]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise([*PAPER, *SPO, *sampler], caplog=caplog)
    assert advice.visits.history_row_share == 0.0
    assert len(warnings) == 1 and "a share of 0.00 of the rows" in warnings[0].getMessage()
    assert "the history sampler's epoch mode" in warnings[0].getMessage()


@pytest.mark.parametrize(("steps", "warns"), [(39, True), (40, False)])
def test_the_threshold_is_three_quarters_of_the_rows(caplog, steps, warns):
    """100 prompts, 10 a step: 39 steps (V = 3.9, share 0.744) warn, 40 steps (V = 4, share 0.75) do not."""
    overrides = [*SPO, "data.train_batch_size=10", f"trainer.total_training_steps={steps}", "trainer.total_epochs=5"]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise(overrides, prompts=100, caplog=caplog)
    assert advice.visits.history_row_share == pytest.approx(1 - 100 / (steps * 10))
    assert bool(warnings) is warns


def test_a_run_it_cannot_read_or_without_a_prompt_history_is_not_advised(caplog):
    """Advice only: no training set yet (V1 before init()) or an estimator that keeps no per-prompt history give no
    advice and no log above debug; a training set the advisor fails on (here: no length) gives no advice and one
    WARNING that names the error (issue 37: it was a debug line), and no exception reaches the run."""

    class NoLength:
        def __len__(self):
            raise TypeError("no length")

    config = compose_config([*PAPER, *SPO])
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert advisor.advise_trainer(SimpleNamespace(config=config)) is None
        for other in ("grpo", "ha_dw"):
            trainer = SimpleNamespace(config=compose_config([*PAPER, f"algorithm.adv_estimator={other}"]),
                                      train_dataset=range(PAPER_PROMPTS))  # fmt: skip
            assert advisor.advise_trainer(trainer) is None and advisor.step_metrics(trainer) == {}
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert advisor.advise_trainer(SimpleNamespace(config=config, train_dataset=NoLength())) is None
        assert advisor.step_metrics(SimpleNamespace(config=config, train_dataset=NoLength())) == {}
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "could not advise this run (TypeError: no length)" in warnings[0].getMessage()
    assert "training goes on" in warnings[0].getMessage()


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


# the V1 trainer's advice at its first advantage step runs verl's real step on a real TransferQueue:
# tests/bv_blend/verl/test_v1_advantage_step.py::test_v1_trainer_advises_at_its_first_advantage_step


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


# ------------------------------------------------------------------- what the advisor counts (issue 37, point 2)
SMALL = ["data.train_batch_size=10", "trainer.total_training_steps=20", "trainer.total_epochs=5"]  # 2 epochs of 100


def test_a_prior_file_counts_only_the_run_prompts_it_holds(caplog, tmp_path):
    """100 prompts, 10 a step, 20 steps: without priors half the rows are revisits (share 0.5). A prior file that
    holds 40 of the run's prompts (and 60 it has not) gives 0.4 + 0.6 x 0.5 = 0.7 (it was 1.0 for any file): the
    warning fires and says how many it holds. One that holds all 100 gives 1.0, no warning."""
    dataset = rl_dataset(tmp_path, 100)
    partial = write_prior_file(tmp_path / "partial.json", text_keys(range(60, 160)))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise([*SPO, *SMALL, f"+algorithm.spo.offline_values={partial}"], dataset=dataset,
                                   caplog=caplog)  # fmt: skip
    assert (advice.prior_covered, advice.distinct_prompts) == (40, 100)
    assert advice.metrics()["advisor/prompt_history_row_share"] == pytest.approx(0.7)
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert f"the prior file (algorithm.spo.offline_values={partial}) holds 40 of the run's 100 prompts" in message
    assert "a share of 0.70 of the rows" in message
    full = write_prior_file(tmp_path / "full.json", text_keys(range(100)))
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise([*SPO, *SMALL, f"+algorithm.spo.offline_values={full}"], dataset=dataset,
                                   caplog=caplog)  # fmt: skip
    assert advice.metrics()["advisor/prompt_history_row_share"] == 1.0 and warnings == []


@pytest.mark.parametrize("level", [[], PROMPT_AND_CLUSTER])
def test_a_prior_file_keyed_otherwise_covers_no_prompt_and_is_warned_on(caplog, tmp_path, level):
    """A file keyed by extra_info['index'] on a run that keys by the prompt's text holds none of its prompts: one
    warning at every level (the cluster level too: the file starts no cluster either), naming a key mismatch as the
    likely cause and how the run keys. The same file on a run with prompt_key_field=index holds them all."""
    dataset = rl_dataset(tmp_path, PAPER_PROMPTS)
    by_index = write_prior_file(tmp_path / "by_index.json", [str(i) for i in range(PAPER_PROMPTS)])
    overrides = [*PAPER, "algorithm.bv_blend.num_clusters=4", *level, f"algorithm.bv_blend.prior_file={by_index}"]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise(overrides, dataset=dataset, caplog=caplog)
    assert advice.prior_covered == 0 and advice.metrics()["advisor/prompt_history_row_share"] == 0.0
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    for part in (f"prior file (algorithm.bv_blend.prior_file={by_index}) holds none of this run's 45000 training "
                 "prompts", "key mismatch", "keys each prompt by the hash of its prompt's text",
                 "same prompt_key_field"):  # fmt: skip
        assert part in message, part
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise([*overrides, "algorithm.bv_blend.prompt_key_field=index"], dataset=dataset,
                                   caplog=caplog)  # fmt: skip
    assert advice.prior_covered == PAPER_PROMPTS and warnings == []


def test_a_missing_prior_file_is_a_warning_that_names_it(caplog, tmp_path):
    """The advisor reads the file; where it cannot (here: missing), it says so in a WARNING and the run goes on."""
    dataset = rl_dataset(tmp_path, 100)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise([*SPO, *SMALL, f"+algorithm.spo.offline_values={tmp_path / 'nope.json'}"],
                                   dataset=dataset, caplog=caplog)  # fmt: skip
    assert advice is None and len(warnings) == 1
    assert "could not advise this run (ValueError: algorithm.spo.offline_values=" in warnings[0].getMessage()
    assert "does not exist" in warnings[0].getMessage()


def test_the_legacy_trainer_draws_gen_batch_size_prompts_a_step(caplog):
    """verl's legacy trainer steps through its dataloader, whose batch is data.gen_batch_size where it is set: 32
    prompts a step at the paper's scale (V = 32 x 500 / 45,000). The V1 trainer's step trains train_batch_size
    prompts (16), gen_batch_size being only how it fetches them."""
    legacy = [*PAPER, *SPO, "trainer.use_v1=false", "+data.gen_batch_size=32"]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise(legacy, caplog=caplog)
        assert advice.visits.batch_size == 32
        assert advice.metrics()["advisor/visits_per_prompt"] == pytest.approx(32 * 500 / PAPER_PROMPTS)
        assert "32 prompts a step x 8 rollouts" in warnings[0].getMessage()
        v1, _ = _advise([*PAPER, *SPO, "+data.gen_batch_size=32"])
    assert v1.visits.batch_size == 16


def test_dynamic_sampling_makes_the_counts_lower_bounds(caplog):
    """With DAPO's filter (algorithm.filter_groups.enable=true) verl refills the filtered groups with more prompts:
    the warning says its counts are lower bounds; without it, it does not."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise([*PAPER, *SPO, "algorithm.filter_groups.enable=true"], caplog=caplog)
    assert advice.lower_bound and len(warnings) == 1
    assert "DAPO's dynamic sampling is on (algorithm.filter_groups.enable=true)" in warnings[0].getMessage()
    assert "lower bounds" in warnings[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        advice, warnings = _advise([*PAPER, *SPO], caplog=caplog)
    assert not advice.lower_bound and "lower bound" not in warnings[0].getMessage()
