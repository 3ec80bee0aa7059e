"""Builders shared by the verl-glue tests (and by the resume worker they start in a fresh process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig
from torchdata.stateful_dataloader import StatefulDataLoader

from bv_blend.codebook import CLUSTER_KEY, Codebook

RESPONSE_LEN = 6
# Prompt groups of varying size (1..4 rows), with their clusters: K=3.
GROUP_SIZES = (4, 3, 1, 2, 4)
GROUP_CLUSTERS = (0, 2, 1, 2, 0)
K = 3
# the paper's run: 16 prompts x 8 rollouts for 500 steps over OpenR1-Math's 45,000 prompts (0.18 visits a prompt)
PAPER_PROMPTS = 45_000
PAPER = ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=8", "trainer.total_training_steps=500",
         "trainer.total_epochs=100"]  # fmt: skip
PROMPT_AND_CLUSTER = ["algorithm.bv_blend.num_clusters=4", "algorithm.bv_blend.history_level=prompt_and_cluster"]


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """Our ``configs/bv_blend.yaml`` composed with the installed verl's ``ppo_trainer`` (as ``main_ppo`` does)."""
    GlobalHydra.instance().clear()
    with initialize_config_module("bv_blend.configs", version_base=None):
        return compose("bv_blend", overrides=list(overrides or []))


def tiny_codebook(path: Path, shift: float = 0.0) -> Path:
    """A valid K=3 codebook file (its content, hence its hash, depends on ``shift``)."""
    centroids = np.eye(K, 4, dtype=np.float32) + shift
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    Codebook(centroids=centroids, encoder_id="test-encoder", seed=0, train_count=K, cluster_sizes=[1] * K).save(path)
    return path


def step_rows(step: int) -> list[dict[str, Any]]:
    """One step's rows as the agent loop produces them: uid per prompt, extra_info with the cluster, a 0/1 reward
    on the last response token, responses of varying length. Deterministic in ``step``."""
    rng = np.random.default_rng(1000 + step)
    rows = []
    for group, (size, cluster) in enumerate(zip(GROUP_SIZES, GROUP_CLUSTERS, strict=True)):
        uid = f"s{step}g{group}x{rng.integers(1 << 30):08x}"
        for session in range(size):
            length = int(rng.integers(2, RESPONSE_LEN + 1))
            scores = torch.zeros(length)
            scores[-1] = float(rng.random() < 0.5)
            rows.append(
                {
                    "key": f"{uid}_{session}_0",
                    "uid": uid,
                    "session_id": session,
                    "cluster": cluster,
                    "extra_info": {CLUSTER_KEY: cluster, "index": group, "split": "train"},
                    "raw_prompt": [{"role": "user", "content": f"problem {group}"}],
                    "response_mask": torch.ones(length, dtype=torch.int64),
                    "rm_scores": scores,
                }
            )
    return rows


def padded(rows: list[dict[str, Any]], key: str) -> torch.Tensor:
    """Right-pad the per-row 1-D tensors ``key`` to (rows, RESPONSE_LEN)."""
    out = torch.zeros(len(rows), RESPONSE_LEN, dtype=rows[0][key].dtype)
    for i, row in enumerate(rows):
        out[i, : row[key].numel()] = row[key]
    return out


def step_dataproto(rows: list[dict[str, Any]], with_extra_info: bool = True):
    """The legacy trainer's view of a step: a ``DataProto`` with uid, raw_prompt and extra_info in
    ``non_tensor_batch``."""
    from verl import DataProto

    non_tensors = {"uid": np.array([r["uid"] for r in rows], dtype=object)}
    raw_prompts = np.empty(len(rows), dtype=object)
    raw_prompts[:] = [r["raw_prompt"] for r in rows]  # lists of messages, one object per row (as verl holds them)
    non_tensors["raw_prompt"] = raw_prompts
    if with_extra_info:
        non_tensors["extra_info"] = np.array([r["extra_info"] for r in rows], dtype=object)
    scores = padded(rows, "rm_scores")
    return DataProto.from_dict(
        tensors={
            "token_level_scores": scores,
            "token_level_rewards": scores.clone(),
            "response_mask": padded(rows, "response_mask"),
        },
        non_tensors=non_tensors,
    )


class RecordingWorkerGroup:
    """Stands in for ``actor_rollout_wg``: the real one drives FSDP workers on GPUs. Records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def save_checkpoint(self, *args, **kwargs) -> None:
        self.calls.append(("save_checkpoint", args, kwargs))

    def load_checkpoint(self, *args, **kwargs) -> None:
        self.calls.append(("load_checkpoint", args, kwargs))


def minimal_trainer(trainer_cls: type, config: DictConfig, global_steps: int = 0) -> Any:
    """A verl trainer object without ``__init__``/``init()`` (which start Ray workers on GPUs), with exactly the
    attributes verl's real ``_save_checkpoint`` / ``_load_checkpoint`` / ``_compute_advantage`` read."""
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback

    trainer = object.__new__(trainer_cls)
    trainer.config = config
    trainer.global_steps = global_steps
    trainer.use_critic = False
    trainer.trainer_mode = "sync"
    trainer.actor_rollout_wg = RecordingWorkerGroup()
    trainer.checkpoint_callback = build_checkpoint_callback(config)
    trainer.train_dataloader = StatefulDataLoader(list(range(40)), batch_size=4)
    return trainer


def run_legacy_steps(steps: range, config: DictConfig) -> None:
    """Advantages of ``steps`` through verl's legacy ``compute_advantage`` (the patched module global)."""
    from verl.trainer.ppo import ray_trainer

    for step in steps:
        ray_trainer.compute_advantage(
            step_dataproto(step_rows(step)), adv_estimator="bv_blend", config=config.algorithm
        )


def state_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
