"""The estimator's options are parsed once per run: at trainer start (``compositions.check_run``, our ``__init__``
hook), which builds the process estimator into ``runtime.RUN``; every step, the checkpoint hooks and the sampler take
that process. Outside a trainer the first use builds it from the config it is given, and a changed config rebuilds."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from verl.trainer.ppo import ray_trainer

from bv_blend.verl import runtime
from bv_blend.verl.compositions import check_run
from bv_blend.verl.glue.bv_blend import BVBlendOptions
from bv_blend.verl.sampler import success_estimates
from bv_blend.verl.state import restore_state, save_state
from tests.bv_blend.verl._helpers import compose_config, minimal_trainer, run_legacy_steps, step_dataproto, step_rows


def _refuse_parsing(monkeypatch):
    def parse(cls, algorithm):
        raise AssertionError("the options were parsed again after trainer start")

    monkeypatch.setattr(BVBlendOptions, "from_algorithm", classmethod(parse))


@pytest.mark.parametrize("level", ["cluster", "prompt_and_cluster"])
def test_trainer_start_builds_the_process_that_steps_checkpoints_and_the_sampler_use(tmp_path, monkeypatch, level):
    config = compose_config([f"trainer.default_local_dir={tmp_path}", "algorithm.bv_blend.num_clusters=3",
                             f"algorithm.bv_blend.history_level={level}"])  # fmt: skip
    check_run(config, legacy=True)
    started = runtime.held("bv_blend")
    assert started is not None and started.algorithm is config.algorithm

    _refuse_parsing(monkeypatch)
    run_legacy_steps(range(1, 3), config)  # the hook and the function verl calls take the started process
    assert runtime.held("bv_blend") is started and started.estimator.num_updates == 2
    p_hat = success_estimates(config.algorithm, np.array(["a prompt"], dtype=object))  # the sampler's face
    assert p_hat.shape == (1,)

    trainer = minimal_trainer(ray_trainer.RayPPOTrainer, config, global_steps=2)
    assert save_state(trainer) is not None
    run_legacy_steps(range(3, 4), config)
    assert started.estimator.num_updates == 3
    with_resume = compose_config([f"trainer.default_local_dir={tmp_path}", "algorithm.bv_blend.num_clusters=3",
                                  f"algorithm.bv_blend.history_level={level}", "trainer.resume_mode=resume_path",
                                  f"trainer.resume_from_path={tmp_path / 'global_step_2'}"])  # fmt: skip
    monkeypatch.undo()
    check_run(with_resume, legacy=True)  # equal options: the same process, now held for this trainer's config
    assert runtime.held("bv_blend").estimator is started.estimator
    _refuse_parsing(monkeypatch)
    assert restore_state(minimal_trainer(ray_trainer.RayPPOTrainer, with_resume, global_steps=2)) is not None
    assert started.estimator.num_updates == 2  # the saved history, restored into the same process


def test_without_a_trainer_start_the_first_use_builds_and_a_changed_config_rebuilds(caplog):
    def step(config, n: int):
        return ray_trainer.compute_advantage(step_dataproto(step_rows(n)), adv_estimator="bv_blend", config=config)

    first = compose_config(["algorithm.bv_blend.num_clusters=3"]).algorithm
    step(first, 0)
    step(compose_config(["algorithm.bv_blend.num_clusters=3"]).algorithm, 1)  # equal options: the same history
    built = runtime.held("bv_blend")
    assert built.algorithm is None and built.estimator.num_updates == 2

    with caplog.at_level(logging.WARNING, logger="bv_blend.verl.runtime"):
        step(compose_config(["algorithm.bv_blend.num_clusters=3", "algorithm.bv_blend.gamma=0.5"]).algorithm, 2)
    assert runtime.held("bv_blend").estimator is not built.estimator
    assert runtime.held("bv_blend").estimator.num_updates == 1 and "history starts afresh" in caplog.text

    bad = compose_config(["algorithm.bv_blend.num_clusters=3", "+algorithm.bv_blend.gamm=0.5"]).algorithm
    with pytest.raises(ValueError, match="gamm"):
        step(bad, 3)


def test_another_config_after_trainer_start_is_read_not_taken_for_the_trainers():
    config = compose_config(["algorithm.bv_blend.num_clusters=3"])
    check_run(config, legacy=True)
    started = runtime.held("bv_blend")
    run_legacy_steps(range(1, 2), compose_config(["algorithm.bv_blend.num_clusters=3", "algorithm.bv_blend.gamma=0.5"]))
    assert runtime.held("bv_blend").estimator is not started.estimator  # its options differ: built from them
    run_legacy_steps(range(2, 3), config)  # the trainer's config again: read, and built afresh (options changed)
    assert runtime.held("bv_blend").options == started.options and runtime.held("bv_blend").estimator.num_updates == 1
