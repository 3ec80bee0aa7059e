"""What the runs of verl's real trainer on CPU share: a task, a briefly warmed-up tiny model and a codebook; and the
pretrained LM's run (SmolLM2-135M-Instruct, instruments/run/pretrained.py) on the same task told how to answer.

The tiny model is warmed up (supervised, a few hundred steps) so that rollouts are sometimes right: mixed groups
give non-zero advantages, so the actor really changes between steps, which the weight-sync tests need.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from bv_blend.codebook.annotate import build_codebook_from_parquet
from instruments.run import tiny
from instruments.run.task import write_task
from instruments.run.tiny import supervised_warmup

K = 4
# 300 steps left the history run's prompts at pass rates 0-0.29 (T = 1): a batch of 8 groups of 4 then had no mixed
# group (step 1 made no update, and the weight-sync check could not tell) in about 4% of launches, and up to 53% for
# the unluckiest draw. At 600 the rates are mostly 0.4-0.8 (the big sums stay near 0, so all-wrong groups remain): under
# 1% for any draw (measured with transformers' sampling, 200 draws a prompt: python -m tests.e2e.probe_warmup).
WARMUP_STEPS = 600


@dataclass(frozen=True)
class CpuAssets:
    work: Path
    base_overrides: tuple[str, ...]  # BV-Blend, the tiny model and its learning rate
    codebook_overrides: tuple[str, ...]  # the codebook and the task annotated with its clusters
    question_to_cluster: dict[str, int]
    task: tuple[Path, Path]  # the train and val parquet files, before annotation

    @property
    def overrides(self) -> tuple[str, ...]:
        """The hydra overrides every e2e run shares."""
        return (*self.base_overrides, *self.codebook_overrides)

    def overrides_with_codebook(self, num_clusters: int) -> tuple[str, ...]:
        """The shared overrides, with a codebook of ``num_clusters`` clusters built on the same task."""
        codebook, _ = _codebook(self.task, self.work / f"clusters_k{num_clusters}", num_clusters)
        return (*self.base_overrides, *codebook)


def _codebook(task: tuple[Path, Path], out_dir: Path, num_clusters: int) -> tuple[tuple[str, ...], list[Path]]:
    built = build_codebook_from_parquet(list(task), out_dir, num_clusters, seed=0)
    overrides = (
        f"algorithm.bv_blend.codebook_path={built.codebook_path}",
        f"data.train_files={built.annotated_paths[0]}",
        f"data.val_files={built.annotated_paths[1]}",
    )
    return overrides, list(built.annotated_paths)


def build_cpu_assets(work: Path, warmup_steps: int = WARMUP_STEPS) -> CpuAssets:
    task = write_task(work / "task", n_train=128, n_val=16, seed=0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tokenizer = tiny.build_tokenizer(tiny.TinyModelSpec.vocab)
    model = tiny.build_model(tiny.TinyModelSpec(), tokenizer)
    supervised_warmup(model, tokenizer, warmup_steps, batch_size=32, lr=1e-3, seed=0)
    tiny.save(model, tokenizer, work / "model")
    codebook, annotated = _codebook(task, work / "clusters", K)
    question_to_cluster = {}
    for path in annotated:
        for extra in pd.read_parquet(path)["extra_info"]:
            question_to_cluster[extra["question"]] = int(extra["bv_blend_cluster"])
    base = (
        "algorithm.adv_estimator=bv_blend",
        f"actor_rollout_ref.model.path={work / 'model'}",
        "actor_rollout_ref.actor.optim.lr=1e-3",  # a visible step, so that stale rollout weights would show
    )
    return CpuAssets(work, base, codebook, question_to_cluster, task)


def pretrained_overrides(work: Path, num_clusters: int = 1) -> tuple[str, ...]:
    """SmolLM2-135M-Instruct (the user's cache, converted once) on the demo's task with the pretrained demo's
    instruction and last-number reward, a codebook of ``num_clusters``: the demo's own path (verl_run.model_overrides
    at fp32, which every CPU runs fast) with the actor's old log-probs recomputed, so that verl compares the rollout's
    probabilities with the actor's (bypass mode would skip that comparison), cpu_tiny's micro-batches, and gradient
    checkpointing (memory, below)."""
    from instruments.run import pretrained
    from instruments.run import reward as demo_reward
    from instruments.run.settings import PRETRAINED_INSTRUCTION, RunSettings
    from instruments.run.verl_run import model_overrides

    task = write_task(work / "task_pretrained", n_train=64, n_val=16, seed=0, per_family_sources=True,
                      instruction=PRETRAINED_INSTRUCTION)
    codebook, _ = _codebook(task, work / f"clusters_pretrained_k{num_clusters}", num_clusters)
    model = pretrained.prepare_smollm2()
    settings = RunSettings(work_dir=work, model=pretrained.SMOLLM2, dtype="fp32", response_length=32)
    # cpu_tiny's micro-batches of 8 (the demo's 16 do not divide this run's 8 rollouts a step)
    left_out = ("algorithm.rollout_correction.bypass_mode", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu")
    kept = [o for o in model_overrides(settings) if not o.startswith(left_out)]
    return ("algorithm.adv_estimator=bv_blend", f"actor_rollout_ref.model.path={model}",
            "actor_rollout_ref.actor.optim.lr=1e-4",  # a visible step for a pretrained model
            # the suite runs this beside a tiny-model run and the unit tests in 24 GiB, and keeping 30 layers'
            # activations for the backward once took the machine past Ray's kill line (95%); recomputing them
            # takes the actor's peak from 5.1 GB to 3.7 GB
            "actor_rollout_ref.model.enable_gradient_checkpointing=true",
            *codebook, *kept, *demo_reward.verl_overrides(last_number_answers=True))
