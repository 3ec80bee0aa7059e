"""Run in a fresh process by test_checkpoint.py: resume through verl's patched ``_load_checkpoint``, train on, and
check the estimator state against the uninterrupted run's, bit for bit.

    python -m tests.bv_blend.verl._resume_worker CKPT_ROOT SAVED_STEP LAST_STEP REFERENCE.pt
"""

from __future__ import annotations

import os
import sys

import torch


def main(root: str, saved_step: int, last_step: int, reference_path: str) -> None:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from bv_blend.verl import runtime
    from tests.bv_blend.verl._helpers import compose_config, minimal_trainer, run_legacy_steps, state_tensors

    reference = state_tensors(torch.load(reference_path, weights_only=True))
    resume_path = os.path.join(root, f"global_step_{saved_step}")
    cases = {
        "v1/auto": (PPOTrainerSync, ["trainer.resume_mode=auto"]),
        "v1/resume_path": (
            PPOTrainerSync,
            ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={resume_path}"],
        ),
        "legacy/auto": (RayPPOTrainer, ["trainer.resume_mode=auto"]),
    }
    for name, (trainer_cls, overrides) in cases.items():
        runtime.reset()
        config = compose_config([f"trainer.default_local_dir={root}", "algorithm.bv_blend.num_clusters=3", *overrides])
        trainer = minimal_trainer(trainer_cls, config)
        trainer._load_checkpoint()
        assert trainer.global_steps == saved_step, (name, trainer.global_steps)
        run_legacy_steps(range(saved_step + 1, last_step + 1), config)
        state = state_tensors(runtime.estimator_for("bv_blend", config.algorithm).estimator.state_dict())
        assert state.keys() == reference.keys(), name
        unequal = [key for key in state if not torch.equal(state[key], reference[key])]
        assert not unequal, (name, unequal)
        print(f"{name}: restored step {saved_step}, continued to {last_step}, state bit-identical")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
