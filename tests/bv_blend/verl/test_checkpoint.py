"""BV-Blend state in verl checkpoints, through verl's real ``_save_checkpoint`` / ``_load_checkpoint``.

The trainers are built without ``__init__`` (which starts Ray workers on GPUs) and their ``actor_rollout_wg`` is a
recording fake, because the real worker group drives FSDP workers that need GPUs: hence ``fake_workers`` in the
names. Everything else is verl 0.9.1's real code: path resolution, ``data.pt``, the tracker file, the resume rules.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.v1 import trainer_sync

from bv_blend.verl import runtime
from bv_blend.verl.records import BY_NAME
from tests.bv_blend.verl._helpers import compose_config, minimal_trainer, run_legacy_steps, state_tensors, tiny_codebook

STATE_FILE = BY_NAME["bv_blend"].state_file

REPO = Path(__file__).resolve().parents[3]
SAVED_STEP, LAST_STEP = 2, 4


def _config(root: Path, *overrides: str):
    return compose_config([f"trainer.default_local_dir={root}", *overrides])


def _train_and_save(root: Path, trainer_cls: type, *overrides: str) -> None:
    config = _config(root, *overrides)
    run_legacy_steps(range(1, SAVED_STEP + 1), config)
    trainer = minimal_trainer(trainer_cls, config, global_steps=SAVED_STEP)
    trainer._save_checkpoint()


@pytest.mark.slow
def test_fake_workers_save_then_resume_in_new_process_is_bit_identical(tmp_path):
    """Save at step 2 through V1's real _save_checkpoint, then a new process resumes (V1 auto, V1 resume_path,
    legacy auto) through the patched _load_checkpoint, trains steps 3-4, and must equal the uninterrupted run."""
    _train_and_save(tmp_path, trainer_sync.PPOTrainerSync, "algorithm.bv_blend.num_clusters=3")
    folder = tmp_path / f"global_step_{SAVED_STEP}"
    assert (folder / STATE_FILE).is_file() and (folder / "data.pt").is_file()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == str(SAVED_STEP)

    config = _config(tmp_path, "algorithm.bv_blend.num_clusters=3")
    run_legacy_steps(range(SAVED_STEP + 1, LAST_STEP + 1), config)  # the uninterrupted run goes on
    reference = tmp_path / "uninterrupted.pt"
    torch.save(runtime.estimator_for("bv_blend", config.algorithm).estimator.state_dict(), reference)

    cmd = [sys.executable, "-W", "ignore", "-m", "tests.bv_blend.verl._resume_worker", str(tmp_path), str(SAVED_STEP)]
    proc = subprocess.run([*cmd, str(LAST_STEP), str(reference)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case in ("v1/auto", "v1/resume_path", "legacy/auto"):
        assert f"{case}: restored step {SAVED_STEP}, continued to {LAST_STEP}, state bit-identical" in proc.stdout


def test_fake_workers_legacy_save_writes_state_and_resume_restores(tmp_path):
    """The legacy RayPPOTrainer's real _save_checkpoint writes the state; its _load_checkpoint restores it."""
    _train_and_save(tmp_path, ray_trainer.RayPPOTrainer, "algorithm.bv_blend.num_clusters=3")
    algorithm = _config(tmp_path, "algorithm.bv_blend.num_clusters=3").algorithm
    saved = state_tensors(runtime.estimator_for("bv_blend", algorithm).estimator.state_dict())
    runtime.reset()
    config = _config(tmp_path, "algorithm.bv_blend.num_clusters=3")
    trainer = minimal_trainer(ray_trainer.RayPPOTrainer, config)
    trainer._load_checkpoint()
    restored = state_tensors(runtime.estimator_for("bv_blend", config.algorithm).estimator.state_dict())
    assert trainer.global_steps == SAVED_STEP and all(torch.equal(restored[k], saved[k]) for k in saved)
    assert [c[0] for c in trainer.actor_rollout_wg.calls] == ["load_checkpoint"]


@pytest.mark.parametrize(
    ("resume_overrides", "error", "match"),
    [
        (["algorithm.bv_blend.num_clusters=4"], ValueError, "K=3 clusters, but this run has K=4"),
        (["algorithm.bv_blend.num_clusters=3", "algorithm.bv_blend.temperature=0.5"], ValueError, "temperature"),
    ],
)
def test_fake_workers_mismatched_state_fails_loudly(tmp_path, resume_overrides, error, match):
    _train_and_save(tmp_path, trainer_sync.PPOTrainerSync, "algorithm.bv_blend.num_clusters=3")
    runtime.reset()
    trainer = minimal_trainer(trainer_sync.PPOTrainerSync, _config(tmp_path, *resume_overrides))
    with pytest.raises(error, match=match) as info:
        trainer._load_checkpoint()
    assert STATE_FILE in str(info.value) and "allow_state_reset" in str(info.value)


def test_fake_workers_state_of_an_unknown_format_is_refused_with_the_reason(tmp_path):
    """A BV-Blend state whose format this version does not read (here 1, written before the stability options) is a
    clear error at resume, and nothing is loaded: the package has no release whose format needs a migration."""
    _train_and_save(tmp_path, trainer_sync.PPOTrainerSync, "algorithm.bv_blend.num_clusters=3")
    path = tmp_path / f"global_step_{SAVED_STEP}" / STATE_FILE
    payload = torch.load(path, weights_only=True)
    payload["estimator"]["format_version"] = 1
    torch.save(payload, path)
    runtime.reset()
    config = _config(tmp_path, "algorithm.bv_blend.num_clusters=3")
    with pytest.raises(ValueError, match="Unsupported BV-Blend state format 1; this version reads format 3") as info:
        minimal_trainer(trainer_sync.PPOTrainerSync, config)._load_checkpoint()
    assert "allow_state_reset" in str(info.value)
    assert runtime.estimator_for("bv_blend", config.algorithm).estimator.num_updates == 0


def test_fake_workers_other_codebook_fails_and_reset_is_explicit(tmp_path):
    book_a, book_b = tiny_codebook(tmp_path / "a.npz"), tiny_codebook(tmp_path / "b.npz", shift=0.1)
    _train_and_save(tmp_path, trainer_sync.PPOTrainerSync, f"algorithm.bv_blend.codebook_path={book_a}")
    runtime.reset()
    other = _config(tmp_path, f"algorithm.bv_blend.codebook_path={book_b}")
    with pytest.raises(ValueError, match="codebook hash"):
        minimal_trainer(trainer_sync.PPOTrainerSync, other)._load_checkpoint()
    runtime.reset()
    reset = "algorithm.bv_blend.allow_state_reset=true"
    opt_out = _config(tmp_path, f"algorithm.bv_blend.codebook_path={book_b}", reset)
    minimal_trainer(trainer_sync.PPOTrainerSync, opt_out)._load_checkpoint()
    assert runtime.estimator_for("bv_blend", opt_out.algorithm).estimator.num_updates == 0


def test_fake_workers_checkpoint_without_state_fails_loudly(tmp_path):
    _train_and_save(tmp_path, trainer_sync.PPOTrainerSync, "algorithm.bv_blend.num_clusters=3")
    os.remove(tmp_path / f"global_step_{SAVED_STEP}" / STATE_FILE)
    runtime.reset()
    with pytest.raises(FileNotFoundError, match=f"no BV-Blend state {STATE_FILE}"):
        config = _config(tmp_path, "algorithm.bv_blend.num_clusters=3")
        minimal_trainer(trainer_sync.PPOTrainerSync, config)._load_checkpoint()


def test_fake_workers_resume_disable_starts_fresh(tmp_path):
    _train_and_save(tmp_path, trainer_sync.PPOTrainerSync, "algorithm.bv_blend.num_clusters=3")
    runtime.reset()
    config = _config(tmp_path, "algorithm.bv_blend.num_clusters=3", "trainer.resume_mode=disable")
    trainer = minimal_trainer(trainer_sync.PPOTrainerSync, config)
    trainer._load_checkpoint()
    assert trainer.global_steps == 0 and trainer.actor_rollout_wg.calls == []
    assert runtime.estimator_for("bv_blend", config.algorithm).estimator.num_updates == 0


def test_fake_workers_other_estimator_writes_no_state(tmp_path):
    """Requirement 6: with grpo the hooks do nothing; verl's own files are written as before."""
    trainer = minimal_trainer(trainer_sync.PPOTrainerSync, _config(tmp_path, "algorithm.adv_estimator=grpo"), 1)
    trainer._save_checkpoint()
    assert (tmp_path / "global_step_1" / "data.pt").is_file()
    assert not (tmp_path / "global_step_1" / STATE_FILE).exists() and runtime.held("bv_blend") is None


@pytest.mark.parametrize("trainer_cls", ["v1", "legacy"])
def test_trainer_start_rejects_missing_k_before_any_worker_starts(trainer_cls):
    """The real constructors, patched: with bv_blend selected but no K / codebook they fail at once."""
    cls = trainer_sync.PPOTrainerSync if trainer_cls == "v1" else ray_trainer.RayPPOTrainer
    with pytest.raises(ValueError, match="needs the number of clusters K"):
        cls(compose_config([]), *([] if trainer_cls == "v1" else [None, None, None]))
