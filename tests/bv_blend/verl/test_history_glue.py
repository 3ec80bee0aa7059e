"""SPO and BV-Blend's prompt level through verl's real legacy ``compute_advantage``, checkpoints and trainer start.

verl 0.9.1's real code on CPU: ``ray_trainer.compute_advantage`` / ``compute_data_metrics`` (patched by the plugin,
which ``import verl`` loaded), the V1 ``_save_checkpoint`` / ``_load_checkpoint`` on a trainer built without
``__init__`` (its worker group is a recording fake: the real one drives GPU workers), and the trainer-start check.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.v1 import trainer_sync

from bv_blend import BVBlendConfig, BVBlendEstimator, SPOEstimator
from bv_blend.history.keys import prompt_key
from bv_blend.verl import runtime
from bv_blend.verl.compositions import check_run
from bv_blend.verl.hooks import METRICS_KEY
from bv_blend.verl.records import BY_NAME
from tests.bv_blend.verl._helpers import K, compose_config, minimal_trainer, padded, step_dataproto, step_rows

LEVELS = {
    "spo": ["algorithm.adv_estimator=spo"],
    "prompt": ["algorithm.bv_blend.history_level=prompt"],
    "prompt_and_cluster": [
        f"algorithm.bv_blend.num_clusters={K}",
        "algorithm.bv_blend.history_level=prompt_and_cluster",
    ],
}


def _reference(name: str):
    if name == "spo":
        return SPOEstimator()
    return BVBlendEstimator(K if name == "prompt_and_cluster" else None, BVBlendConfig(history_level=name))


def _expected(reference, name: str, rows):
    uids = np.array([r["uid"] for r in rows], dtype=object)
    keys = np.array([prompt_key(r["raw_prompt"]) for r in rows], dtype=object)
    scores, mask = padded(rows, "rm_scores"), padded(rows, "response_mask")
    if name == "spo":
        return reference.compute_token_level(scores, mask, uids, keys)[0]
    clusters = torch.tensor([r["cluster"] for r in rows]) if name == "prompt_and_cluster" else None
    return reference.compute_token_level(scores, mask, uids, clusters, prompt_keys=keys)[0]


def _legacy(config, step: int):
    estimator = str(config.algorithm.adv_estimator)
    return ray_trainer.compute_advantage(step_dataproto(step_rows(step)), adv_estimator=estimator,
                                         config=config.algorithm)  # fmt: skip


@pytest.mark.parametrize("name", list(LEVELS))
def test_legacy_compute_advantage_keys_each_prompt_and_keeps_its_history(name):
    """Three steps of the same prompts (step_rows repeats them): verl's advantages equal the verl-free estimator's,
    and the metrics ride on the batch to compute_data_metrics."""
    config = compose_config(LEVELS[name])
    reference = _reference(name)
    for step in range(3):
        data = _legacy(config, step)
        torch.testing.assert_close(data.batch["advantages"], _expected(reference, name, step_rows(step)), rtol=0,
                                   atol=0)  # fmt: skip
        assert data.meta_info[METRICS_KEY] == reference.metrics
    prefix = "spo/" if name == "spo" else "bv_blend/"
    tracked = data.meta_info[METRICS_KEY][f"{prefix}prompts_tracked"]
    assert tracked == len({r["raw_prompt"][0]["content"] for r in step_rows(0)})


def test_the_prompt_key_field_keys_by_extra_info():
    config = compose_config(["algorithm.adv_estimator=spo", "+algorithm.spo.prompt_key_field=index"])
    _legacy(config, 0)
    estimator = runtime.estimator_for("spo", config.algorithm)
    assert sorted(estimator.tracker.keys) == sorted({str(r["extra_info"]["index"]) for r in step_rows(0)})


def test_a_batch_without_prompt_text_is_a_clear_error():
    config = compose_config(LEVELS["spo"])
    data = step_dataproto(step_rows(0))
    data.non_tensor_batch.pop("raw_prompt")
    with pytest.raises(ValueError, match="has no text to key its history by"):
        ray_trainer.compute_advantage(data, adv_estimator="spo", config=config.algorithm)
    assert runtime.held("spo").estimator.num_updates == 0


def test_the_default_key_is_stable_across_processes():
    """The key must not depend on Python's per-process hash seed: two fresh interpreters with other seeds agree."""
    code = ("from bv_blend.history.keys import prompt_key; print(prompt_key([{'role': 'system', 'content': 's'}, "
            "{'role': 'user', 'content': '  What is 2+2?  '}]), prompt_key('What is 2+2?'))")  # fmt: skip
    outputs = set()
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outputs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                   check=True).stdout)  # fmt: skip
    assert len(outputs) == 1
    first, second = outputs.pop().split()
    assert first == second == prompt_key("What is 2+2?")


@pytest.mark.parametrize("name", ["spo", "prompt_and_cluster"])
@pytest.mark.parametrize("trainer_cls", ["v1", "legacy"])
def test_fake_workers_checkpoint_round_trip_is_bit_identical(tmp_path, name, trainer_cls):
    cls = trainer_sync.PPOTrainerSync if trainer_cls == "v1" else ray_trainer.RayPPOTrainer
    config = compose_config([*LEVELS[name], f"trainer.default_local_dir={tmp_path}"])
    record = BY_NAME["spo" if name == "spo" else "bv_blend"]
    for step in (0, 1):
        _legacy(config, step)
    minimal_trainer(cls, config, global_steps=2)._save_checkpoint()
    assert (tmp_path / "global_step_2" / record.state_file).is_file()
    uninterrupted = [_legacy(config, step).batch["advantages"] for step in (2, 3)]

    runtime.reset()
    trainer = minimal_trainer(cls, copy.deepcopy(config))
    trainer._load_checkpoint()
    assert trainer.global_steps == 2
    resumed = [_legacy(config, step).batch["advantages"] for step in (2, 3)]
    assert all(torch.equal(a, b) for a, b in zip(resumed, uninterrupted, strict=True))
    runtime.reset()  # and without the restore they would differ: the check can tell
    fresh = [_legacy(config, step).batch["advantages"] for step in (2, 3)]
    assert not all(torch.equal(a, b) for a, b in zip(fresh, uninterrupted, strict=True))


def test_a_resume_with_another_history_level_is_refused_with_the_option_that_continues(tmp_path):
    config = compose_config([*LEVELS["prompt_and_cluster"], f"trainer.default_local_dir={tmp_path}"])
    _legacy(config, 0)
    minimal_trainer(trainer_sync.PPOTrainerSync, config, global_steps=1)._save_checkpoint()
    runtime.reset()
    other = compose_config([f"algorithm.bv_blend.num_clusters={K}", f"trainer.default_local_dir={tmp_path}"])
    with pytest.raises(ValueError, match="set algorithm.bv_blend.history_level=prompt_and_cluster"):
        minimal_trainer(trainer_sync.PPOTrainerSync, other)._load_checkpoint()


def _training_parquet(path: Path) -> Path:
    rows = step_rows(0)
    frame = pd.DataFrame({"prompt": [r["raw_prompt"] for r in rows], "extra_info": [r["extra_info"] for r in rows]})
    frame.to_parquet(path)
    return path


def test_a_prior_file_warms_the_history_at_trainer_start(tmp_path):
    """history_spec 4: read at trainer start; prompts start from their scores, clusters from their prompts' pooled
    scores; a key no training row has is reported, not an error."""
    train = _training_parquet(tmp_path / "train.parquet")
    key = prompt_key(step_rows(0)[0]["raw_prompt"])
    priors = tmp_path / "priors.json"
    priors.write_text(json.dumps({key: [1, 1, 1, 0], "no-such-prompt": [0, 0]}))
    config = compose_config([*LEVELS["prompt_and_cluster"], f"data.train_files=[{train}]",
                             f"algorithm.bv_blend.prior_file={priors}"])  # fmt: skip
    check_run(config)
    estimator = runtime.estimator_for("bv_blend", config.algorithm).estimator
    count, mean, _, seen = estimator.prompts.lookup([key])
    assert seen[0] and count[0] == 4.0 and mean[0] == 0.75
    cluster = step_rows(0)[0]["cluster"]
    assert estimator.moments.seen.tolist() == [k == cluster for k in range(K)]
    assert estimator.moments.mean[cluster] == 0.75 and estimator.moments.count[cluster] == 4.0


@pytest.mark.parametrize(
    ("content", "match"),
    [("not json", "is not a JSON file"), ('{"a": [1, 2]}', r"scores\s+in \[0, 1\]"), ('{"a": []}', "non-empty list"),
     ("[]", "non-empty JSON object")],
)  # fmt: skip
def test_a_malformed_prior_file_fails_at_trainer_start(tmp_path, content, match):
    path = tmp_path / "priors.json"
    path.write_text(content)
    for overrides in (["algorithm.adv_estimator=spo", f"+algorithm.spo.offline_values={path}"],
                      [f"algorithm.bv_blend.num_clusters={K}", f"algorithm.bv_blend.prior_file={path}"]):  # fmt: skip
        runtime.reset()
        with pytest.raises(ValueError, match=match):
            check_run(compose_config(overrides))


def test_spo_refuses_dapos_group_filter_at_trainer_start():
    config = compose_config(["algorithm.adv_estimator=spo", "algorithm.filter_groups.enable=true"])
    with pytest.raises(ValueError, match="at SPO's one rollout per prompt that is every group"):
        check_run(config)


def test_the_prompt_level_needs_no_codebook_at_trainer_start():
    check_run(compose_config(["algorithm.bv_blend.history_level=prompt"]))  # no num_clusters, no codebook_path
    process = runtime.process_for("bv_blend", compose_config(["algorithm.bv_blend.history_level=prompt"]).algorithm)
    assert process.options.inputs() == frozenset({"prompt_keys"})
    assert OmegaConf.select(compose_config([]), "algorithm.bv_blend.history_level") == "cluster"
