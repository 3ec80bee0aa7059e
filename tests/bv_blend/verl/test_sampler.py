"""The history-driven prompt sampler (history_spec 5 and 6): its weights and draws, its refusals, and an exact resume
through verl's real ``StatefulDataLoader`` with the sampler verl's own (patched) ``create_rl_sampler`` returns; with
``epoch_without_replacement`` too (its math alone: tests/bv_blend/history/test_sampler_epoch.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from scipy import stats
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo import ray_trainer

from bv_blend.history import sampler as weights
from bv_blend.history.keys import prompt_key
from bv_blend.verl import runtime
from bv_blend.verl.compositions import check_run
from bv_blend.verl.hooks import METRICS_KEY
from bv_blend.verl.sampler import UNSEEDED, HistorySampler, SamplerOptions, restore_skipped_state, success_estimates
from tests.bv_blend.verl._helpers import compose_config

PROMPTS = 40
BATCH = 4
EPOCH_MODE = "data.history_sampler.epoch_without_replacement=true"


def dataset(n: int = PROMPTS) -> list[dict]:
    return [{"raw_prompt": [{"role": "user", "content": f"problem {i}"}], "extra_info": {"index": i}}
            for i in range(n)]  # fmt: skip


def run_config(*overrides: str):
    config = compose_config(["algorithm.adv_estimator=spo", "data.history_sampler.enable=true",
                             "data.dataloader_num_workers=0", f"data.train_batch_size={BATCH}", "data.seed=7",
                             "actor_rollout_ref.rollout.n=1", *overrides])  # fmt: skip
    runtime.reset()
    check_run(config)  # what the trainer's __init__ hook does: builds the estimator, records the run
    return config


def loader(config, data: list[dict]) -> StatefulDataLoader:
    """verl's dataloader as its trainers build it, with the sampler from verl's own create_rl_sampler (patched)."""
    sampler = ray_trainer.create_rl_sampler(config.data, data)
    assert isinstance(sampler, HistorySampler)
    return StatefulDataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True, collate_fn=lambda rows: rows)


def train_on(config, batch: list[dict], step: int) -> dict[str, float]:
    """One step's advantages through verl's legacy compute_advantage: the history moves, so the weights do."""
    from tests.bv_blend.verl._companion_helpers import group_batch

    rewards = [[float((row["extra_info"]["index"] * 7 + step) % 3 == 0)] for row in batch]
    data = group_batch(rewards, prefix=f"s{step}", seed=step)
    raw = np.empty(len(batch), dtype=object)
    raw[:] = [row["raw_prompt"] for row in batch]
    data.non_tensor_batch["raw_prompt"] = raw
    out = ray_trainer.compute_advantage(data, adv_estimator="spo", config=config.algorithm)
    return out.meta_info[METRICS_KEY]  # what compute_data_metrics moves into the step's metrics


def test_a_flat_history_draws_uniformly():
    """Before any step SPO's p^ is 0.5 everywhere: every prompt is equally likely (chi-square over many draws)."""
    config = run_config()
    sampler = ray_trainer.create_rl_sampler(config.data, dataset())
    counts = np.zeros(PROMPTS)
    for _ in range(500):
        np.add.at(counts, sampler._draw(), 1)
    assert stats.chisquare(counts).pvalue > 1e-3
    metrics = runtime.sampler_metrics(runtime.held("spo"))
    assert metrics["sampler/weight_entropy"] == pytest.approx(1.0)
    assert metrics["sampler/p_hat_mean_drawn"] == 0.5 and metrics["sampler/zero_variance_expected"] == 1.0


def test_the_draws_follow_the_weights():
    """One prompt a draw: frequencies proportional to sqrt(p (1 - p)) + 0.05 (chi-square); several: distinct."""
    p_hat = np.linspace(0, 1, 21)
    w = weights.prompt_weights(p_hat)
    np.testing.assert_allclose(w[[0, 10, 20]], [0.05, 0.55, 0.05])
    rng = np.random.default_rng(0)
    counts = np.bincount([weights.draw(w, 1, rng)[0] for _ in range(20000)], minlength=21)
    assert stats.chisquare(counts, f_exp=20000 * w / w.sum()).pvalue > 1e-3
    batch = weights.draw(w, 15, rng)
    assert len(set(batch.tolist())) == 15
    assert weights.zero_variance_expected(np.array([0.0, 0.5]), 2) == pytest.approx((1 + 0.5) / 2)


def test_the_weights_come_from_the_history_and_each_step_gets_the_metrics_of_its_batch():
    config = run_config()
    data = dataset()
    batches, drawn = iter(loader(config, data)), set()
    expected = {"sampler/weight_entropy", "sampler/p_hat_mean_drawn", "sampler/zero_variance_expected",
                "sampler/weight_age_steps"}  # fmt: skip
    for step in range(3):
        batch = next(batches)
        drawn |= {row["extra_info"]["index"] for row in batch}
        metrics = train_on(config, batch, step)
        assert {k for k in metrics if k.startswith("sampler/")} == expected
        assert metrics["sampler/weight_age_steps"] == 0  # drawn after the previous step's advantages
    spo = runtime.estimator_for("spo", config.algorithm)
    _, known = spo.success_estimates([prompt_key(row["raw_prompt"]) for row in data])
    assert set(np.flatnonzero(known).tolist()) == drawn  # the drawn prompts, and only those, have a history
    assert metrics["sampler/weight_entropy"] < 1.0  # the history is no longer flat


def test_a_resumed_run_draws_exactly_the_batches_of_an_uninterrupted_one():
    """Six steps straight, against three steps, a checkpoint (the dataloader's state and the estimator's, as verl
    and our hooks save them), a fresh process state, and three more steps."""
    data = dataset()
    config = run_config()
    straight = []
    for step, batch in zip(range(6), loader(config, data), strict=False):
        straight.append([row["extra_info"]["index"] for row in batch])
        train_on(config, batch, step)

    config = run_config()
    first = loader(config, data)
    iterator = iter(first)
    for step in range(3):
        train_on(config, next(iterator), step)
    saved_loader = first.state_dict()
    saved_state = runtime.estimator_for("spo", config.algorithm).state_dict()

    config = run_config()  # a fresh run: empty history, new sampler
    runtime.estimator_for("spo", config.algorithm).load_state_dict(saved_state)
    resumed_loader = loader(config, data)
    resumed_loader.load_state_dict(saved_loader)
    resumed = []
    for step, batch in zip(range(3, 6), resumed_loader, strict=False):
        resumed.append([row["extra_info"]["index"] for row in batch])
        train_on(config, batch, step)
    assert resumed == straight[3:]


@pytest.mark.parametrize("mode", [[], [EPOCH_MODE]], ids=["draws_from_all", "epoch_without_replacement"])
def test_a_run_resumed_at_an_epoch_boundary_draws_the_next_epoch_of_an_uninterrupted_one(tmp_path, mode):
    """verl's legacy trainer does not restore its dataloader's state at an epoch boundary (ray_trainer.py
    ``_load_checkpoint``: the state marks the loader exhausted), which left a resumed sampler drawing the next epoch
    from data.seed's first draw (found by tests/e2e/test_cpu_history.py[spo_legacy]). The hook restores the sampler
    from the checkpoint's data.pt: the next epoch is the uninterrupted run's (with the epoch option, every prompt
    available again)."""
    data, epoch = dataset(), PROMPTS // BATCH
    config = run_config(*mode)
    straight, uninterrupted = [], loader(config, data)
    for _ in range(2):  # two epochs, as verl's trainers loop: for epoch ...: for batch in dataloader
        for batch in uninterrupted:
            straight.append([row["extra_info"]["index"] for row in batch])
            train_on(config, batch, len(straight) - 1)
    assert len(straight) == 2 * epoch

    config = run_config(*mode)
    first = loader(config, data)
    for step, batch in enumerate(first):  # one whole epoch, then verl's checkpoint: data.pt and our state
        train_on(config, batch, step)
    torch.save(first.state_dict(), tmp_path / "data.pt")
    saved_state = runtime.estimator_for("spo", config.algorithm).state_dict()

    def resumed(restore: bool) -> list[list[int]]:
        config = run_config(*mode)
        runtime.estimator_for("spo", config.algorithm).load_state_dict(saved_state)
        fresh = loader(config, data)  # verl skips the loader's state here
        assert restore_skipped_state(str(tmp_path)) is restore
        drawn = []
        for step, batch in zip(range(epoch, 2 * epoch), fresh, strict=False):
            drawn.append([row["extra_info"]["index"] for row in batch])
            train_on(config, batch, step)
        return drawn

    assert resumed(restore=True) == straight[epoch:]
    runtime.RUN.sampler = None  # as if the hook had not run: the draws restart from the seed
    config = run_config(*mode)
    runtime.estimator_for("spo", config.algorithm).load_state_dict(saved_state)
    unrestored = [[row["extra_info"]["index"] for row in batch] for batch in loader(config, data)]
    assert unrestored != straight[epoch:], "the check cannot tell a restored sampler from a fresh one"


@pytest.mark.parametrize("hook", [True, False], ids=["with_the_hook", "verl_alone"])
def test_a_mid_epoch_resume_draws_the_uninterrupted_runs_batches(tmp_path, hook):
    """Mid-epoch verl restores the loader's state, and the sampler's with it, but only once the loader starts
    iterating: the hook, which runs before the training loop, finds the sampler at 0 draws and restores the same
    state first. Either way the resumed run draws what the uninterrupted run drew."""
    data, epoch, saved_at = dataset(), PROMPTS // BATCH, 3
    config = run_config()
    straight = []
    for step, batch in enumerate(loader(config, data)):
        straight.append([row["extra_info"]["index"] for row in batch])
        train_on(config, batch, step)

    config = run_config()
    first = loader(config, data)
    iterator = iter(first)
    for step in range(saved_at):  # mid-epoch: verl's checkpoint, data.pt and our state
        train_on(config, next(iterator), step)
    torch.save(first.state_dict(), tmp_path / "data.pt")
    saved_state = runtime.estimator_for("spo", config.algorithm).state_dict()

    config = run_config()
    runtime.estimator_for("spo", config.algorithm).load_state_dict(saved_state)
    resumed = loader(config, data)
    resumed.load_state_dict(torch.load(tmp_path / "data.pt", weights_only=False))  # verl's mid-epoch resume
    assert runtime.RUN.sampler.draws == 0  # the loader has not handed the state on yet
    if hook:
        assert restore_skipped_state(str(tmp_path)) is True and runtime.RUN.sampler.draws == saved_at
    drawn = []
    for step, batch in zip(range(saved_at, epoch), resumed, strict=False):
        drawn.append([row["extra_info"]["index"] for row in batch])
        train_on(config, batch, step)
    assert drawn == straight[saved_at:epoch]
    assert restore_skipped_state(None) is False and restore_skipped_state(str(tmp_path / "none")) is False


def test_an_epoch_is_the_dataset_divided_by_the_batch_and_the_next_epoch_carries_on():
    config = run_config()
    sampler = ray_trainer.create_rl_sampler(config.data, dataset())
    assert len(sampler) == PROMPTS and len(list(iter(sampler))) == PROMPTS
    assert len(list(iter(sampler))) == PROMPTS  # a second epoch


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["algorithm.adv_estimator=grpo"], "this estimator keeps none"),
        (["algorithm.adv_estimator=ha_dw"], "this estimator keeps none"),
        (["data.shuffle=false"], "data.shuffle=false"),
        (["algorithm.filter_groups.enable=true"], "would discard the groups the weights chose"),
        (["data.dataloader_num_workers=2"], "set data.dataloader_num_workers=0"),
        # verl forces data.gen_batch_size=1 in these modes: the sampler would draw one prompt at a time
        (["trainer.v1.trainer_mode=separate_async"], r"trainer.v1.trainer_mode=separate_async makes verl fetch one "
                                                     r"prompt at a time .*repeat a prompt.*trainer_mode=sync"),
        (["trainer.v1.trainer_mode=colocate_async"], "trainer_mode=colocate_async makes verl fetch one prompt"),
        (["trainer.v1.sampler.sync_refill_failed_groups=true"], r"sync_refill_failed_groups=true makes verl fetch one "
                                                                r"prompt at a time.*set it false"),
        (["data.gen_batch_size=1"], r"data.gen_batch_size=1 makes verl fetch 1 prompts.*set data.gen_batch_size=null"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("mode", [[], [EPOCH_MODE]], ids=["draws_from_all", "epoch_without_replacement"])
def test_the_sampler_is_refused_at_trainer_start_with_the_reason_and_the_fix(overrides, reason, mode):
    config = compose_config(["algorithm.adv_estimator=spo", "data.history_sampler.enable=true",
                             "data.dataloader_num_workers=0", *mode, *overrides])  # fmt: skip
    with pytest.raises(ValueError, match=reason):
        check_run(config)


@pytest.mark.parametrize(
    "overrides",
    [["trainer.v1.trainer_mode=separate_async"], ["trainer.v1.sampler.sync_refill_failed_groups=true"],
     ["algorithm.filter_groups.enable=true"]],
)  # fmt: skip
def test_the_v1_trainer_refuses_the_modes_that_fetch_one_prompt_at_a_time(overrides):
    """verl's own V1 trainer constructor, patched by the plugin: it refuses before verl forces gen_batch_size=1."""
    from verl.trainer.ppo.v1 import trainer_sync
    config = compose_config(["algorithm.adv_estimator=spo", "data.history_sampler.enable=true",
                             "data.dataloader_num_workers=0", *overrides])  # fmt: skip
    with pytest.raises(ValueError, match="fetch one prompt at a time"):
        trainer_sync.PPOTrainerSync(config)


def test_the_sync_mode_at_the_train_batch_passes():
    check_run(compose_config(["algorithm.adv_estimator=spo", "data.history_sampler.enable=true",
                              "data.dataloader_num_workers=0",
                              "data.gen_batch_size=${data.train_batch_size}"]))  # fmt: skip


def test_a_null_seed_draws_as_verls_own_unseeded_sampler_does():
    """verl's unseeded sampler starts from torch's fixed default seed (every unseeded run draws one order): the
    history sampler takes that seed too, not 0, and two unseeded runs draw the same batches."""
    config = run_config("data.seed=null")
    verl_orders = [list(ray_trainer.create_rl_sampler(OmegaConf.merge(config.data, {"history_sampler": {"enable":
                   False}}), dataset())) for _ in range(2)]  # fmt: skip
    assert verl_orders[0] == verl_orders[1]  # verl's own behaviour, which the sampler follows
    first, second = (ray_trainer.create_rl_sampler(config.data, dataset()) for _ in range(2))
    assert first.seed == second.seed == torch.Generator().initial_seed() == UNSEEDED != 0
    assert first._draw().tolist() == second._draw().tolist()


def test_off_by_default_verls_sampler_stays():
    config = compose_config([])
    assert OmegaConf.select(config, "data.history_sampler.enable") is False
    assert OmegaConf.select(config, "data.history_sampler.epoch_without_replacement") is False
    assert not isinstance(ray_trainer.create_rl_sampler(config.data, dataset()), HistorySampler)


def test_options_are_validated_by_name():
    with pytest.raises(ValueError, match=r"data.history_sampler.epsilon=0.0 is invalid"):
        SamplerOptions(enable=True, epsilon=0.0)
    with pytest.raises(ValueError, match=r"Unknown option\(s\) data.history_sampler.\{enabled\}"):
        SamplerOptions.from_mapping({"enabled": True})


def test_a_state_of_another_seed_is_refused():
    sampler = HistorySampler(dataset(), BATCH, 1, SamplerOptions(enable=True), lambda: None)
    other = HistorySampler(dataset(), BATCH, 2, SamplerOptions(enable=True), lambda: None)
    with pytest.raises(ValueError, match="data.seed=1"):
        other.load_state_dict(sampler.state_dict())


# ------------------------------------------------------------------------------ resume guards (issue 37, point 3)
def _checkpoint_after_two_steps(config, data: list[dict]) -> dict:
    first = loader(config, data)
    iterator = iter(first)
    for step in range(2):
        train_on(config, next(iterator), step)
    return first.state_dict()  # what verl saves as data.pt


def test_a_resume_on_a_training_set_of_another_size_is_refused_with_the_fix():
    """The sampler's state records the training set's size; verl's real StatefulDataLoader, resumed over a dataset
    that lost prompts (another max_prompt_length, another filter), refuses with an error that names both sizes, the
    likely causes and how to go on, instead of drawing indices of other prompts silently."""
    config = run_config()
    saved = _checkpoint_after_two_steps(config, dataset())
    assert saved["_sampler_iter_state"]["sampler_state"]["dataset_size"] == PROMPTS
    config = run_config()
    resumed = loader(config, dataset(PROMPTS - 4))
    resumed.load_state_dict(saved)
    with pytest.raises(ValueError) as error:
        next(iter(resumed))  # the loader hands the sampler its state when it starts iterating
    message = str(error.value)
    for part in (f"a training set of {PROMPTS} prompts; this run's has {PROMPTS - 4}", "data.max_prompt_length",
                 "Resume with the data settings the checkpoint", "trainer.resume_mode=disable"):  # fmt: skip
        assert part in message, part
    same = loader(run_config(), dataset())  # the same dataset resumes
    same.load_state_dict(saved)
    assert len(next(iter(same))) == BATCH


def test_a_state_saved_before_the_size_was_recorded_loads_with_a_warning(caplog):
    """A checkpoint of an earlier version has no dataset_size: it cannot be checked, so it loads (an unchanged
    dataset still resumes exactly) and a warning says the check was not possible (docs/history.md)."""
    config = run_config()
    saved = _checkpoint_after_two_steps(config, dataset())
    del saved["_sampler_iter_state"]["sampler_state"]["dataset_size"]
    resumed = loader(run_config(), dataset())
    resumed.load_state_dict(saved)
    with caplog.at_level("WARNING", logger="bv_blend.verl.sampler"):
        assert len(next(iter(resumed))) == BATCH
    assert any("predates its dataset-size record" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------- without replacement over an epoch (history_spec 5)
UNEVEN = 42  # 10 batches of 4 an epoch, 2 prompts left out of each


def indices(batch: list[dict]) -> list[int]:
    return [row["extra_info"]["index"] for row in batch]


def test_an_epoch_without_replacement_draws_no_prompt_twice_and_reports_its_drawn_share():
    """Two epochs through verl's dataloader as verl's trainers loop, the history moving at every step: each epoch
    draws 40 distinct prompts of 42 (its 10 batches; the 2 the weights left to the end wait for the next epoch), the
    next starts with every prompt available again, and each step's metrics say how much of the dataset its epoch has
    drawn, its batch included."""
    config = run_config(EPOCH_MODE)
    uninterrupted = loader(config, dataset(UNEVEN))
    expected = {"sampler/weight_entropy", "sampler/p_hat_mean_drawn", "sampler/zero_variance_expected",
                "sampler/weight_age_steps", "sampler/epoch_drawn_share"}  # fmt: skip
    epochs, step = [], 0
    for _ in range(2):
        drawn, shares = [], []
        for batch in uninterrupted:
            drawn += indices(batch)
            metrics = train_on(config, batch, step)
            assert {k for k in metrics if k.startswith("sampler/")} == expected
            shares.append(metrics["sampler/epoch_drawn_share"])
            step += 1
        assert len(drawn) == len(set(drawn)) == UNEVEN // BATCH * BATCH
        np.testing.assert_allclose(shares, np.arange(1, UNEVEN // BATCH + 1) * BATCH / UNEVEN)
        epochs.append(drawn)
    assert set(epochs[0]) & set(epochs[1])  # the second epoch draws the first epoch's prompts again


def test_with_a_flat_history_each_epoch_is_a_uniform_random_permutation():
    """No step yet, so SPO's p^ is 0.5 for every prompt: over 800 data.seeds the sampler's epoch is a permutation of
    the 40 prompts whose first and last prompts are uniform (chi-square), and it is exactly the verl-free draw from
    the same seed."""
    config = run_config(EPOCH_MODE)
    data = dataset()
    options = SamplerOptions(enable=True, epoch_without_replacement=True)
    flat = weights.prompt_weights(np.full(PROMPTS, 0.5))
    firsts, lasts = np.zeros(PROMPTS), np.zeros(PROMPTS)
    for seed in range(800):
        epoch = list(HistorySampler(data, BATCH, seed, options, config))
        assert sorted(epoch) == list(range(PROMPTS))
        firsts[epoch[0]] += 1
        lasts[epoch[-1]] += 1
    assert stats.chisquare(firsts).pvalue > 1e-3 and stats.chisquare(lasts).pvalue > 1e-3
    rng, drawn, verl_free = np.random.default_rng(799), np.zeros(PROMPTS, dtype=bool), []
    for _ in range(PROMPTS // BATCH):
        batch = weights.draw_from_remaining(flat, BATCH, drawn, rng)
        drawn[batch] = True
        verl_free += batch.tolist()
    assert epoch == verl_free


def test_each_batch_is_drawn_by_the_historys_weights_among_the_prompts_not_yet_drawn():
    """In the third epoch the prompts not yet drawn have the earlier epochs' history (in the first, SPO's undrawn
    prompts are all at p^ = 0.5; after one visit each, this task's p^ are 0.233 or 0.767, of equal weights):
    each batch is exactly the verl-free draw from them, by the weights of the history at that moment, from the
    sampler's RNG, and not the draw that flat weights would give."""
    config = run_config(EPOCH_MODE)
    data = dataset()
    keys = np.array([prompt_key(row["raw_prompt"]) for row in data])
    uninterrupted, step = loader(config, data), 0
    for _ in range(2):
        for batch in uninterrupted:
            train_on(config, batch, step)
            step += 1
    batches, drawn, unlike_flat = iter(uninterrupted), np.zeros(PROMPTS, dtype=bool), 0

    def draw_now(prompt_weights: np.ndarray) -> list[int]:
        rng = np.random.default_rng()
        rng.bit_generator.state = runtime.RUN.sampler.rng.bit_generator.state
        return weights.draw_from_remaining(prompt_weights, BATCH, drawn, rng).tolist()

    for batch_in_epoch in range(PROMPTS // BATCH):
        p_hat = success_estimates(config.algorithm, keys)
        if batch_in_epoch < PROMPTS // BATCH - 1:
            assert np.ptp(weights.prompt_weights(p_hat[~drawn])) > 0.01  # the weights differ among the prompts left
        expected = draw_now(weights.prompt_weights(p_hat))
        unlike_flat += expected != draw_now(np.ones(PROMPTS))
        batch = next(batches)
        assert indices(batch) == expected
        drawn[expected] = True
        train_on(config, batch, step)
        step += 1
    assert unlike_flat > 0  # the check tells the history's weights from flat ones


@pytest.mark.parametrize("hook", [True, False], ids=["with_the_hook", "verl_alone"])
def test_a_mid_epoch_resume_without_replacement_continues_the_epoch_and_the_next_exactly(tmp_path, hook):
    """Three steps, verl's checkpoint (data.pt, which holds the prompts the epoch drew) and our history, a fresh run
    restored from them: it draws the rest of the epoch and the whole next one as the uninterrupted run did."""
    data, epoch, saved_at = dataset(UNEVEN), UNEVEN // BATCH, 3
    config = run_config(EPOCH_MODE)
    straight, uninterrupted = [], loader(config, data)
    for _ in range(2):
        for batch in uninterrupted:
            straight.append(indices(batch))
            train_on(config, batch, len(straight) - 1)

    config = run_config(EPOCH_MODE)
    first = loader(config, data)
    iterator = iter(first)
    for step in range(saved_at):
        train_on(config, next(iterator), step)
    torch.save(first.state_dict(), tmp_path / "data.pt")
    saved_state = runtime.estimator_for("spo", config.algorithm).state_dict()
    sampler_state = first.state_dict()["_sampler_iter_state"]["sampler_state"]
    assert sorted(sampler_state["epoch_drawn"]) == sorted(sum(straight[:saved_at], []))

    config = run_config(EPOCH_MODE)
    runtime.estimator_for("spo", config.algorithm).load_state_dict(saved_state)
    resumed = loader(config, data)
    resumed.load_state_dict(torch.load(tmp_path / "data.pt", weights_only=False))
    if hook:
        assert restore_skipped_state(str(tmp_path)) is True
    drawn = []
    for _ in range(2):  # the rest of the saved epoch, then the next, as verl's loop iterates the loader again
        for batch in resumed:
            drawn.append(indices(batch))
            train_on(config, batch, saved_at + len(drawn) - 1)
    assert drawn == straight[saved_at:] and len(drawn) == 2 * epoch - saved_at


def _epoch_checkpoint(*mode: str) -> dict:
    """The sampler's state in verl's data.pt after two steps of a run with ``mode``."""
    return _checkpoint_after_two_steps(run_config(*mode), dataset())["_sampler_iter_state"]["sampler_state"]


def test_a_checkpoint_drawn_from_all_prompts_resumes_into_the_epoch_mode_with_a_warning(caplog):
    """Turning the option on at a resume: the checkpoint never recorded which prompts its epoch drew, so the rest of
    that epoch avoids only the prompts drawn after the resume, and a warning says so; the RNG resumes as saved."""
    saved = _epoch_checkpoint()
    sampler = HistorySampler(dataset(), BATCH, 7, SamplerOptions(enable=True, epoch_without_replacement=True),
                             run_config(EPOCH_MODE))  # fmt: skip
    with caplog.at_level("WARNING", logger="bv_blend.verl.sampler"):
        sampler.load_state_dict(saved)
    assert any("epoch_without_replacement=false and this run has true" in r.getMessage() for r in caplog.records)
    assert sampler.draws == 2 and not sampler.epoch_drawn.any()


def test_a_damaged_record_of_the_epochs_prompts_is_refused_before_anything_changes():
    saved = _epoch_checkpoint(EPOCH_MODE)
    assert len(saved["epoch_drawn"]) == 2 * BATCH
    sampler = HistorySampler(dataset(), BATCH, 7, SamplerOptions(enable=True, epoch_without_replacement=True),
                             run_config(EPOCH_MODE))  # fmt: skip
    for damaged in (saved["epoch_drawn"][1:], [*saved["epoch_drawn"][1:], saved["epoch_drawn"][0] + PROMPTS]):
        with pytest.raises(ValueError, match=r"records \d+ prompts drawn in its epoch, not 8 distinct ones below 40"):
            sampler.load_state_dict({**saved, "epoch_drawn": damaged})
        assert sampler.draws == 0 and not sampler.epoch_drawn.any()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"{EPOCH_MODE[:-4]}maybe"], r"data.history_sampler.epoch_without_replacement='maybe' is invalid: it must "
                                      r"be true or false"),
        (["data.history_sampler.enable=false", EPOCH_MODE],
         r"epoch_without_replacement=True is invalid: it acts only on the history sampler, which is off: set "
         r"data.history_sampler.enable=true as well, or drop it"),
        (["+data.history_sampler.epoch_without_replacment=true"],
         r"Unknown option\(s\) data.history_sampler.\{epoch_without_replacment\}.*Check the spelling"),
    ],
    ids=["not_a_bool", "sampler_off", "misspelt"],
)  # fmt: skip
def test_a_bad_epoch_option_is_refused_at_trainer_start_with_the_fix(overrides, message):
    config = compose_config(["algorithm.adv_estimator=spo", "data.history_sampler.enable=true",
                             "data.dataloader_num_workers=0", *overrides])  # fmt: skip
    with pytest.raises(ValueError, match=message):
        check_run(config)
