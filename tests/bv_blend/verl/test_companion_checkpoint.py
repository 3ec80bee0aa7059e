"""HA-DW's anchor history in verl checkpoints (``global_step_N/ha_dw_state.pt``), through verl's real
``_save_checkpoint`` / ``_load_checkpoint`` and our hooks, as tests/bv_blend/verl/test_checkpoint.py does for BV-Blend.

The trainers are built without ``__init__`` (which starts Ray workers on GPUs) and their ``actor_rollout_wg`` is a
recording fake, because the real worker group drives FSDP workers that need GPUs: hence ``fake_workers`` in the
names. Everything else is verl 0.9.1's real code: path resolution, ``data.pt``, the tracker file, the resume rules.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import pytest
import torch
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.v1 import trainer_sync

from bv_blend.paper.configs import compose_paper_config
from bv_blend.verl import runtime
from bv_blend.verl.records import BY_NAME
from tests.bv_blend.verl._helpers import minimal_trainer, step_dataproto, step_rows

DATA = ["data.train_files=[train.parquet]", "data.val_files=[val.parquet]"]
STATE_FILE = BY_NAME["ha_dw"].state_file
SAVED_STEP, LAST_STEP = 2, 4


@functools.cache
def _composed(overrides: tuple[str, ...]):
    return compose_paper_config("ha_dw", [*DATA, *overrides])  # hydra composition: seconds on this machine


def _config(root: Path, *overrides: str):
    config = copy.deepcopy(_composed(overrides))
    config.trainer.default_local_dir = str(root)
    return config


def _steps(steps: range, config) -> list[torch.Tensor]:
    """Advantages of ``steps`` through verl's legacy ``compute_advantage``."""
    return [
        ray_trainer.compute_advantage(step_dataproto(step_rows(step)), adv_estimator="ha_dw",
                                      config=config.algorithm).batch["advantages"]
        for step in steps
    ]  # fmt: skip


def _save_at(root: Path, trainer_cls: type, *overrides: str) -> None:
    config = _config(root, *overrides)
    _steps(range(1, SAVED_STEP + 1), config)
    minimal_trainer(trainer_cls, config, global_steps=SAVED_STEP)._save_checkpoint()


@pytest.mark.parametrize("mode", ["window", "kalman"])
@pytest.mark.parametrize("trainer_cls", ["v1", "legacy"])
def test_fake_workers_round_trip_is_bit_identical(tmp_path, mode, trainer_cls):
    """Save at step 2, resume in a fresh runtime through the patched _load_checkpoint, train steps 3-4: the state
    and the advantages equal the uninterrupted run's, bit for bit."""
    cls = trainer_sync.PPOTrainerSync if trainer_cls == "v1" else ray_trainer.RayPPOTrainer
    mode_override = f"algorithm.ha_dw.mode={mode}"
    _save_at(tmp_path, cls, mode_override)
    folder = tmp_path / f"global_step_{SAVED_STEP}"
    assert (folder / STATE_FILE).is_file() and (folder / "data.pt").is_file()
    assert not (folder / BY_NAME["bv_blend"].state_file).exists()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == str(SAVED_STEP)

    config = _config(tmp_path, mode_override)
    uninterrupted = _steps(range(SAVED_STEP + 1, LAST_STEP + 1), config)
    reference = runtime.estimator_for("ha_dw", config.algorithm).state_dict()
    assert reference["num_updates"] == LAST_STEP

    runtime.reset()
    trainer = minimal_trainer(cls, _config(tmp_path, mode_override))
    trainer._load_checkpoint()
    assert trainer.global_steps == SAVED_STEP
    assert runtime.estimator_for("ha_dw", config.algorithm).num_updates == SAVED_STEP
    resumed = _steps(range(SAVED_STEP + 1, LAST_STEP + 1), config)
    state = runtime.estimator_for("ha_dw", config.algorithm).state_dict()
    assert torch.equal(state["history"], reference["history"]) and state["history"].dtype == torch.float64
    assert state["num_updates"] == reference["num_updates"] and state["config"] == reference["config"]
    assert all(torch.equal(a, b) for a, b in zip(resumed, uninterrupted, strict=True))
    # ...and a run that had not restored the state would differ (so the check can tell).
    runtime.reset()
    fresh = _steps(range(SAVED_STEP + 1, LAST_STEP + 1), config)
    assert not all(torch.equal(a, b) for a, b in zip(fresh, uninterrupted, strict=True))


@pytest.mark.parametrize(
    ("overrides", "restore"),
    [
        (["algorithm.ha_dw.lambda_scale=1.5"], "set algorithm.ha_dw.lambda_scale=1.3."),
        (["algorithm.ha_dw.mode=kalman"], "set algorithm.ha_dw.mode=window."),
        (["algorithm.norm_adv_by_std_in_grpo=false"], "set algorithm.norm_adv_by_std_in_grpo=true."),
    ],
)
def test_fake_workers_state_of_other_options_fails_loudly(tmp_path, overrides, restore):
    """The error names the change and the override that continues the saved history exactly."""
    _save_at(tmp_path, trainer_sync.PPOTrainerSync)
    runtime.reset()
    trainer = minimal_trainer(trainer_sync.PPOTrainerSync, _config(tmp_path, *overrides))
    with pytest.raises(ValueError, match="was written with another config") as info:
        trainer._load_checkpoint()
    assert restore in str(info.value)
    assert STATE_FILE in str(info.value) and "algorithm.ha_dw.allow_state_reset=true" in str(info.value)
    assert runtime.estimator_for("ha_dw", trainer.config.algorithm).num_updates == 0  # nothing was loaded


def test_fake_workers_missing_state_fails_and_reset_is_explicit(tmp_path):
    _save_at(tmp_path, trainer_sync.PPOTrainerSync)
    os.remove(tmp_path / f"global_step_{SAVED_STEP}" / STATE_FILE)
    runtime.reset()
    with pytest.raises(FileNotFoundError, match=f"no HA-DW state {STATE_FILE}"):
        minimal_trainer(trainer_sync.PPOTrainerSync, _config(tmp_path))._load_checkpoint()
    runtime.reset()
    opt_out = _config(tmp_path, "algorithm.ha_dw.allow_state_reset=true")
    trainer = minimal_trainer(trainer_sync.PPOTrainerSync, opt_out)
    trainer._load_checkpoint()
    assert trainer.global_steps == SAVED_STEP and runtime.estimator_for("ha_dw", opt_out.algorithm).num_updates == 0


def test_fake_workers_corrupt_state_is_refused(tmp_path):
    _save_at(tmp_path, trainer_sync.PPOTrainerSync)
    path = tmp_path / f"global_step_{SAVED_STEP}" / STATE_FILE
    payload = torch.load(path, weights_only=True)
    payload["estimator"]["history"] = torch.tensor([0.5, 7.0], dtype=torch.float64)  # outside [0, 1]
    torch.save(payload, path)
    runtime.reset()
    with pytest.raises(ValueError, match="the file is corrupt"):
        minimal_trainer(trainer_sync.PPOTrainerSync, _config(tmp_path))._load_checkpoint()


def test_fake_workers_maxnorm_writes_no_state(tmp_path):
    """MaxNorm-AC is stateless: verl's own files only."""
    config = compose_paper_config("maxnorm_rloo", [*DATA, f"trainer.default_local_dir={tmp_path}"])
    minimal_trainer(trainer_sync.PPOTrainerSync, config, 1)._save_checkpoint()
    assert sorted(p.name for p in (tmp_path / "global_step_1").iterdir() if p.name.endswith("_state.pt")) == []
    assert (tmp_path / "global_step_1" / "data.pt").is_file()
