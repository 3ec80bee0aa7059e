"""Issue 37, A and B: BV-Blend's prior file acts through every face that builds the estimator, never as a silent
no-op, and a resume with another prior file is refused as SPO's is.

The faces: the library (``BVBlendEstimator.warm_start``; ``BVBlendConfig`` has no ``prior_file`` and says so), verl's
face outside the trainer (``bv_blend.verl.offline``: the prompt levels from the build, the cluster levels after
``offline.start_run``, a call before it refused) and the trainer's checkpoint hooks (real ``_save_checkpoint`` /
``_load_checkpoint``, fake workers as in test_checkpoint.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from verl.trainer.ppo.v1 import trainer_sync

from bv_blend import BVBlendConfig, BVBlendEstimator
from bv_blend.history.priors import load_priors
from bv_blend.verl import offline, runtime
from bv_blend.verl.glue.bv_blend import PRIORS_HASH
from bv_blend.verl.records import BY_NAME
from tests.bv_blend.verl._helpers import K, compose_config, minimal_trainer, run_legacy_steps

# Two prompts x 2 rollouts, each group with one right and one wrong answer: GRPO's baseline is 0.5 for both, a prior
# of 0.9 moves the blended baseline of prompt "a" (and of its cluster) away from it.
KEYS = np.array(["a", "a", "b", "b"], dtype=object)
UIDS = np.array(["u0", "u0", "u1", "u1"], dtype=object)
CLUSTERS = np.array([0, 0, 1, 1])
SCORES = torch.tensor([1.0, 0.0, 1.0, 0.0])
PRIORS = {"a": [1.0] * 8 + [0.0], "b": [0.0] * 7 + [1.0]}


def _prior_file(folder: Path, scores: dict[str, list[float]] = PRIORS) -> Path:
    path = folder / "priors.json"
    path.write_text(json.dumps(scores))
    return path


def _offline(level: str, prior_file: Path | None, start: bool = True) -> torch.Tensor:
    """One call through ``bv_blend.verl.offline`` as the labs make it, from a fresh history."""
    options = {"history_level": level, "num_clusters": K}
    if prior_file is not None:
        options["prior_file"] = str(prior_file)
    algorithm = offline.algorithm_config("bv_blend", {"bv_blend": options})
    offline.reset_history("bv_blend")
    if start:
        offline.start_run(algorithm, dict(zip(KEYS.tolist(), CLUSTERS.tolist(), strict=True)))
    rewards = torch.zeros(4, 2)
    rewards[:, -1] = SCORES
    return offline.compute_advantages(rewards, torch.ones(4, 2), UIDS, algorithm, cluster_ids=CLUSTERS,
                                      prompt_keys=KEYS)  # fmt: skip


@pytest.mark.parametrize("level", ["prompt", "cluster", "prompt_and_cluster"])
def test_the_offline_face_applies_the_prior_file_at_every_history_level(tmp_path, level):
    without, with_priors = _offline(level, None), _offline(level, _prior_file(tmp_path))
    assert not torch.allclose(without, with_priors)


def test_the_prompt_level_needs_no_start_run_and_its_priors_act_from_the_build(tmp_path):
    prior_file = _prior_file(tmp_path)
    assert torch.equal(_offline("prompt", prior_file, start=False), _offline("prompt", prior_file))
    assert not torch.allclose(_offline("prompt", prior_file, start=False), _offline("prompt", None, start=False))


@pytest.mark.parametrize("level", ["cluster", "prompt_and_cluster"])
def test_a_cluster_level_call_before_its_training_prompts_are_known_is_refused(tmp_path, level):
    fix = r"bv_blend\.verl\.offline\.start_run\(algorithm, \{prompt key: cluster id\}\)"
    with pytest.raises(ValueError, match=rf"prior_file=.* {fix}"):
        _offline(level, _prior_file(tmp_path), start=False)


def test_the_offline_face_matches_the_library_face(tmp_path):
    """offline.start_run + compute_advantages is BVBlendEstimator.warm_start + compute, to the bit."""
    config = BVBlendConfig(history_level="prompt_and_cluster")
    estimator = BVBlendEstimator(K, config)
    estimator.warm_start(load_priors(_prior_file(tmp_path), "test"), {"a": 0, "b": 1})
    rewards = torch.zeros(4, 2)
    rewards[:, -1] = SCORES
    library, _ = estimator.compute_token_level(rewards, torch.ones(4, 2), UIDS, torch.from_numpy(CLUSTERS),
                                               prompt_keys=KEYS)  # fmt: skip
    plain, _ = BVBlendEstimator(K, config).compute_token_level(rewards, torch.ones(4, 2), UIDS,
                                                               torch.from_numpy(CLUSTERS), prompt_keys=KEYS)
    assert torch.equal(library, _offline("prompt_and_cluster", tmp_path / "priors.json"))
    assert not torch.allclose(library, plain)


def test_the_library_config_has_no_prior_file_and_says_so():
    with pytest.raises(ValueError, match=r"Unknown option\(s\) algorithm\.bv_blend\.\{prior_file\}"):
        BVBlendConfig.from_mapping({"prior_file": "priors.json"})


# --- B: the resume guard --------------------------------------------------------------------------------------------

STATE_FILE = BY_NAME["bv_blend"].state_file


def _run_and_save(root: Path, *overrides: str) -> Path:
    config = compose_config([f"trainer.default_local_dir={root}", "algorithm.bv_blend.history_level=prompt",
                             *overrides])  # fmt: skip
    run_legacy_steps(range(1, 3), config)
    minimal_trainer(trainer_sync.PPOTrainerSync, config, global_steps=2)._save_checkpoint()
    runtime.reset()
    return root / "global_step_2" / STATE_FILE


def _resume(root: Path, *overrides: str) -> None:
    config = compose_config([f"trainer.default_local_dir={root}", "algorithm.bv_blend.history_level=prompt",
                             *overrides])  # fmt: skip
    minimal_trainer(trainer_sync.PPOTrainerSync, config)._load_checkpoint()


def test_a_resume_with_another_prior_file_is_refused_with_the_fix(tmp_path):
    first = _prior_file(tmp_path)
    other = tmp_path / "other" / "priors.json"
    other.parent.mkdir()
    other.write_text(json.dumps({"a": [0.0, 0.0]}))
    state = _run_and_save(tmp_path / "ckpt", f"algorithm.bv_blend.prior_file={first}")
    assert torch.load(state, weights_only=True)[PRIORS_HASH] is not None
    saved = torch.load(state, weights_only=True)["estimator"]
    _resume(tmp_path / "ckpt", f"algorithm.bv_blend.prior_file={first}")  # the same file resumes the history
    held = runtime.held("bv_blend").estimator.estimator.state_dict()
    assert held["num_updates"] == saved["num_updates"] == 2 and repr(held["prompts"]) == repr(saved["prompts"])
    runtime.reset()
    for changed in (f"algorithm.bv_blend.prior_file={other}", "algorithm.bv_blend.prior_file=null"):
        with pytest.raises(ValueError, match="silently ignore this run's.*allow_state_reset=true"):
            _resume(tmp_path / "ckpt", changed)
        runtime.reset()
    _resume(tmp_path / "ckpt", f"algorithm.bv_blend.prior_file={other}", "algorithm.bv_blend.allow_state_reset=true")
    # the history starts over, from the other file's priors
    afresh = runtime.held("bv_blend").estimator.estimator.state_dict()
    assert afresh["num_updates"] == 0 and repr(afresh["prompts"]) != repr(saved["prompts"])


def test_a_resume_that_adds_a_prior_file_is_refused(tmp_path):
    _run_and_save(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="started from no prior file"):
        _resume(tmp_path / "ckpt", f"algorithm.bv_blend.prior_file={_prior_file(tmp_path)}")


def test_a_state_from_before_the_check_resumes_with_a_warning(tmp_path, caplog):
    """docs/priors.md: a state without the hash cannot tell its priors; it resumes as it is, said in a warning."""
    prior_file = _prior_file(tmp_path)
    state = _run_and_save(tmp_path / "ckpt", f"algorithm.bv_blend.prior_file={prior_file}")
    payload = torch.load(state, weights_only=True)
    del payload[PRIORS_HASH]
    torch.save(payload, state)
    with caplog.at_level("WARNING"):
        _resume(tmp_path / "ckpt", f"algorithm.bv_blend.prior_file={prior_file}")
    assert "predates the prior file check" in caplog.text
