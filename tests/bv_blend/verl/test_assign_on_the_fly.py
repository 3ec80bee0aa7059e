"""``on_missing_cluster: assign``: prompts that reach verl without a cluster id are encoded with the codebook's
encoder (the real packaged MiniLM) and get the same id the offline annotation would have given them.

Runs verl's real legacy ``compute_advantage`` (the patched module global) on a ``DataProto`` whose
``extra_info`` lacks the id for some prompts; the codebook is built by ``build_codebook_from_parquet``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from bv_blend.codebook import CLUSTER_KEY
from bv_blend.codebook.annotate import build_codebook_from_parquet
from bv_blend.codebook.encode import TextEncoder
from bv_blend.verl import runtime
from bv_blend.verl.clusters import MissingClusterError
from tests.bv_blend.codebook.test_annotate import questions, verl_frame
from tests.bv_blend.verl._helpers import compose_config

ROLLOUTS = 2


@pytest.fixture(scope="module")
def annotated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("assign")
    source = folder / "train.parquet"
    verl_frame(questions(0) + questions(10)).to_parquet(source, index=False)
    encoder = TextEncoder(cache_dir=folder / "cache", show_progress=False)
    built = build_codebook_from_parquet([source], folder / "k3", 3, seed=0, encoder=encoder)
    return built.codebook_path, pd.read_parquet(built.annotated_paths[0]).to_dict("records")


def dataproto(rows: list[dict], drop_id_every: int):
    """The legacy trainer's batch: ROLLOUTS rows per prompt; every ``drop_id_every``-th prompt lost its id."""
    from verl import DataProto

    uids, extra_infos, prompts = [], [], []
    for index, row in enumerate(rows):
        extra_info = dict(row["extra_info"])
        if index % drop_id_every == 0:
            extra_info.pop(CLUSTER_KEY)
        for _ in range(ROLLOUTS):
            uids.append(f"uid{index}")
            extra_infos.append(extra_info)
            prompts.append(list(row["prompt"]))
    rewards = torch.zeros(len(uids), 3)
    rewards[:, -1] = torch.from_numpy(np.arange(len(uids)) % 2).float()
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.ones(len(uids), 3)},
        non_tensors={
            "uid": np.array(uids, dtype=object),
            "extra_info": np.array(extra_infos, dtype=object),
            "prompt": np.array(prompts + [None], dtype=object)[:-1],  # keep each prompt a list of messages
        },
    )


def test_missing_ids_are_assigned_like_the_offline_annotation(annotated):
    from verl.trainer.ppo import ray_trainer

    codebook_path, rows = annotated
    config = compose_config([f"algorithm.bv_blend.codebook_path={codebook_path}",
                             "algorithm.bv_blend.on_missing_cluster=assign"])
    estimator = runtime.estimator_for("bv_blend", config.algorithm).estimator
    received = {}
    compute = estimator.compute_token_level

    def recording(rewards, mask, group_ids, cluster_ids, **options):
        received.update(zip(list(group_ids), cluster_ids.tolist(), strict=True))
        return compute(rewards, mask, group_ids, cluster_ids, **options)

    estimator.compute_token_level = recording
    ray_trainer.compute_advantage(dataproto(rows, drop_id_every=2), adv_estimator="bv_blend", config=config.algorithm)

    expected = {f"uid{index}": row["extra_info"][CLUSTER_KEY] for index, row in enumerate(rows)}
    assert received == expected
    assert len(set(expected.values())) == 3  # the fixture's three topics: a wrong assignment would show


def test_missing_ids_are_an_error_that_says_how_to_annotate(annotated):
    from verl.trainer.ppo import ray_trainer

    codebook_path, rows = annotated
    config = compose_config([f"algorithm.bv_blend.codebook_path={codebook_path}"])
    with pytest.raises(MissingClusterError, match="bv-blend codebook"):
        ray_trainer.compute_advantage(dataproto(rows, drop_id_every=3), adv_estimator="bv_blend",
                                      config=config.algorithm)


@pytest.mark.parametrize("mode", ["assign", "error"])
def test_the_history_sampler_gives_unannotated_prompts_the_cluster_the_estimator_assigns(annotated, mode):
    """history_spec 5: an unseen prompt's p^ is its cluster's m1_k. The sampler reads each row's cluster id once, at
    its first draw; a row without one gets, with ``assign``, the id the estimator gives it at its step (the same as
    the offline annotation), and stays without a cluster (-1: p^ from the prior, else 0.5) with ``error``."""
    from verl.trainer.ppo import ray_trainer

    from bv_blend.verl.compositions import check_run

    codebook_path, rows = annotated
    config = compose_config([f"algorithm.bv_blend.codebook_path={codebook_path}",
                             f"algorithm.bv_blend.on_missing_cluster={mode}", "data.history_sampler.enable=true",
                             "data.dataloader_num_workers=0", "data.train_batch_size=4", "data.seed=3",
                             "actor_rollout_ref.rollout.n=2"])
    runtime.reset()
    check_run(config)
    dataset = []
    for index, row in enumerate(rows):
        extra_info = dict(row["extra_info"])
        if index % 2 == 0:
            extra_info.pop(CLUSTER_KEY)
        dataset.append({"raw_prompt": list(row["prompt"]), "extra_info": extra_info})
    sampler = ray_trainer.create_rl_sampler(config.data, dataset)
    _, clusters = sampler._prompts(config)
    annotation = np.array([row["extra_info"][CLUSTER_KEY] for row in rows])
    odd = np.arange(len(rows)) % 2 == 1
    np.testing.assert_array_equal(clusters[odd], annotation[odd])  # read from extra_info
    expected = annotation[~odd] if mode == "assign" else np.full((~odd).sum(), -1)
    np.testing.assert_array_equal(clusters[~odd], expected)
    assert len(set(annotation[~odd].tolist())) > 1  # a wrong assignment would show
