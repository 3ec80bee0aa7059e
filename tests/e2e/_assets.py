"""What every run of verl's real trainer on CPU shares: a task, a briefly warmed-up tiny model and a codebook.

The model is warmed up (supervised, a few hundred steps) so that rollouts are sometimes right: mixed groups give
non-zero advantages, so the actor really changes between steps, which the weight-sync tests need.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from bv_blend.codebook.annotate import build_codebook_from_parquet
from bv_blend.demo import model as tiny
from bv_blend.demo.task import write_task
from bv_blend.demo.warmup import supervised_warmup

K = 4
WARMUP_STEPS = 300


@dataclass(frozen=True)
class CpuAssets:
    work: Path
    overrides: tuple[str, ...]  # the hydra overrides every e2e run shares
    question_to_cluster: dict[str, int]


def build_cpu_assets(work: Path) -> CpuAssets:
    train, val = write_task(work / "task", n_train=128, n_val=16, seed=0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tokenizer = tiny.build_tokenizer(tiny.TinyModelSpec.vocab)
    model = tiny.build_model(tiny.TinyModelSpec(), tokenizer)
    supervised_warmup(model, tokenizer, WARMUP_STEPS, batch_size=32, lr=1e-3, seed=0)
    tiny.save(model, tokenizer, work / "model")
    built = build_codebook_from_parquet([train, val], work / "clusters", K, seed=0)
    question_to_cluster = {}
    for path in built.annotated_paths:
        for extra in pd.read_parquet(path)["extra_info"]:
            question_to_cluster[extra["question"]] = int(extra["bv_blend_cluster"])
    overrides = (
        "algorithm.adv_estimator=bv_blend",
        f"algorithm.bv_blend.codebook_path={built.codebook_path}",
        f"actor_rollout_ref.model.path={work / 'model'}",
        f"data.train_files={built.annotated_paths[0]}",
        f"data.val_files={built.annotated_paths[1]}",
        "actor_rollout_ref.actor.optim.lr=1e-3",  # a visible step, so that stale rollout weights would show
    )
    return CpuAssets(work, overrides, question_to_cluster)
