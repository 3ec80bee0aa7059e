"""The lab's estimators are the shipped ones: verl's registered functions and our BVBlendEstimator, bit for bit.

Every lab run's batches are traced; each batch is then given to the real thing directly: BVBlendEstimator with
the same history (fed the same batches from empty), verl's estimator functions, and verl's trainer-side
``compute_advantage`` on a DataProto.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos

from bv_blend import BVBlendConfig, BVBlendEstimator
from bv_blend.verl import offline, runtime
from bv_blend.verl.channel import advantage_step
from instruments.lab.estimators import ESTIMATORS, Advantages
from tests.instruments.lab._helpers import SMALL, lab_advantages, traced, verl_face


@pytest.mark.parametrize("key", ["bv_sem", "bv_fixed", "bv_neff", "bv_sigma", "bv_sem_clip5"])
@pytest.mark.parametrize("codebook", ["true", "fine"])
def test_lab_bv_blend_equals_the_estimator_with_the_same_history(key, codebook):
    trace = traced(key, codebook=codebook)
    num_clusters = SMALL.num_clusters * (4 if codebook == "fine" else 1)
    direct = BVBlendEstimator(num_clusters, BVBlendConfig.from_mapping(ESTIMATORS[key].options["bv_blend"]))
    history_used = False
    for step in trace:
        rewards, mask, uids, clusters = verl_face(step)
        expected, _ = direct.compute_token_level(rewards, mask, uids, torch.from_numpy(clusters))
        np.testing.assert_array_equal(lab_advantages(step), expected[:, 0].numpy().astype(np.float64))
        all_equal = (step["rewards"] == step["rewards"][:, :1]).all(axis=1)
        history_used |= bool(np.any(np.abs(step["advantages"][all_equal]) > 0))
    assert direct.num_updates == len(trace)
    assert history_used, "no zero-variance group got an advantage: the history was never used"


@pytest.mark.parametrize(
    ("key", "call"),
    [
        ("grpo", lambda r, m, u: core_algos.compute_grpo_outcome_advantage(r, m, u, norm_adv_by_std_in_grpo=True)),
        ("drgrpo", lambda r, m, u: core_algos.compute_grpo_outcome_advantage(r, m, u, norm_adv_by_std_in_grpo=False)),
        ("rloo", lambda r, m, u: core_algos.compute_rloo_outcome_advantage(r, m, u)),
        (
            "reinforce_pp",
            lambda r, m, u: core_algos.compute_reinforce_plus_plus_outcome_advantage(
                r, m, config=OmegaConf.create({"gamma": 1.0})
            ),
        ),
    ],
)
def test_lab_verl_estimators_equal_verl_functions_called_directly(key, call):
    trace = traced(key)
    for step in trace:
        rewards, mask, uids, _ = verl_face(step)
        expected, _ = call(rewards, mask, uids)
        np.testing.assert_array_equal(lab_advantages(step), expected[:, 0].numpy().astype(np.float64))
    assert any(np.abs(step["advantages"]).sum() > 0 for step in trace)


@pytest.mark.parametrize("key", ["grpo", "drgrpo", "rloo", "reinforce_pp", "bv_sem"])
def test_offline_adapter_mirrors_verl_trainer_compute_advantage(key):
    """The same batch through the lab's adapter and through verl's trainer function (ray_trainer.compute_advantage)."""
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer

    spec = ESTIMATORS[key]
    step = traced(key, steps=3)[-1]
    rewards, mask, uids, clusters = verl_face(step)
    ours = Advantages(spec, SMALL.num_clusters)(
        step["rewards"], step["uids"], step["cluster_ids"], step["success_prob"]
    )
    runtime.reset()  # the trainer's call starts from the same (empty) history
    algorithm = offline.algorithm_config(spec.adv_estimator, spec.algorithm_options(SMALL.num_clusters))
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": uids}
    )
    with advantage_step(cluster_map=dict(zip(uids.tolist(), clusters.tolist(), strict=True))):
        data = ray_trainer.compute_advantage(
            data,
            adv_estimator=spec.adv_estimator,
            gamma=algorithm.gamma,
            lam=algorithm.lam,
            norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo,
            config=algorithm,
        )
    np.testing.assert_array_equal(ours.ravel(), data.batch["advantages"][:, 0].numpy().astype(np.float64))


def test_bv_blend_without_cluster_ids_is_a_clear_error():
    rewards = torch.tensor([[1.0], [0.0]])
    with pytest.raises(ValueError, match="cluster_ids"):
        offline.compute_advantages(
            rewards,
            torch.ones_like(rewards),
            np.array(["a", "a"], dtype=object),
            offline.algorithm_config("bv_blend", {"bv_blend": {"num_clusters": 2}}),
        )


def test_algorithm_config_is_verls_default_node_with_the_options():
    node = offline.algorithm_config("grpo", {"norm_adv_by_std_in_grpo": False})
    assert node.adv_estimator == "grpo" and node.norm_adv_by_std_in_grpo is False
    assert node.gamma == 1.0 and node.lam == 1.0 and "kl_ctrl" in node  # verl's own defaults
    assert offline.algorithm_config("grpo").norm_adv_by_std_in_grpo is True  # a fresh copy each time


@pytest.mark.parametrize(("key", "level"), [("spo", None), ("bv_prompt", "prompt"), ("bv_prompt_cluster",
                                                                                    "prompt_and_cluster")])  # fmt: skip
def test_lab_prompt_histories_equal_the_estimators_with_the_same_history(key, level):
    """SPO and BV-Blend's prompt levels, fed the traced batches with each prompt's key: the lab's advantages are the
    estimator's, and prompts came back (the history was read)."""
    from bv_blend import SPOEstimator

    trace = traced(key, steps=20)
    direct = SPOEstimator() if level is None else BVBlendEstimator(SMALL.num_clusters,
                                                                   BVBlendConfig(history_level=level))  # fmt: skip
    for step in trace:
        rewards, mask, uids, clusters = verl_face(step)
        keys = np.repeat(step["prompt_keys"], step["rewards"].shape[1])
        if level is None:
            expected, _ = direct.compute_token_level(rewards, mask, uids, keys)
        else:
            expected, _ = direct.compute_token_level(rewards, mask, uids, torch.from_numpy(clusters), prompt_keys=keys)
        np.testing.assert_array_equal(lab_advantages(step), expected[:, 0].numpy().astype(np.float64))
    tracked = len(direct.tracker) if level is None else len(direct.prompts)
    assert tracked < sum(len(step["prompt_keys"]) for step in trace), "no prompt came back"


@pytest.mark.parametrize("key", ["spo", "bv_prompt_cluster"])
def test_the_labs_history_sampler_draws_with_the_shipped_functions(key):
    """Each step's prompts are the shipped draw (sqrt(p (1 - p)) + 0.05) from the estimator's p^ before the step, as
    verl's sampler reads it, with the task's own sampler stream."""
    from bv_blend.history.sampler import draw, prompt_weights
    from instruments.lab.env import Task

    trace = traced(key, steps=10, sampler="history")
    task = Task(SMALL, 1, 10)
    keys, clusters = task.prompt_keys(), task.codebook("true")[0]
    rng, estimator = task.sampler_rng(), Advantages(ESTIMATORS[key], SMALL.num_clusters)
    assert len(trace) == 10
    for step in trace:
        p_hat = offline.success_estimates(estimator.algorithm, keys, clusters)
        np.testing.assert_array_equal(step["prompts"], draw(prompt_weights(p_hat), SMALL.prompts_per_step, rng))
        estimator(step["rewards"], step["uids"], step["cluster_ids"], step["success_prob"], step["prompt_keys"])


def test_the_oracle_sampler_draws_by_the_true_success():
    from bv_blend.history.sampler import draw, prompt_weights
    from instruments.lab.env import Policy, Task, sigmoid

    trace = traced("grpo", steps=1, sampler="oracle")
    task = Task(SMALL, 1, 1)
    p = sigmoid(Policy(task).logits(task.difficulty(0)))
    np.testing.assert_array_equal(trace[0]["prompts"], draw(prompt_weights(p), SMALL.prompts_per_step,
                                                            task.sampler_rng()))  # fmt: skip
