#!/usr/bin/env python
"""Which bv_blend files run during one BV-Blend advantage step, through verl's own paths (no trainer launched).

    python scripts/bench_step_files.py          # both trainer paths, history_level cluster and prompt_and_cluster
    python scripts/bench_step_files.py --levels cluster --paths legacy

For each history level it starts a run the way verl's trainer does (our ``__init__`` hook's check,
``compositions.check_run``, on ``configs/bv_blend.yaml`` composed with verl's ``ppo_trainer``), runs one warm-up
step, then records with ``sys.setprofile`` every bv_blend file whose code runs during the second step:

- ``legacy``: verl's ``ray_trainer.compute_advantage`` (wrapped by our hook) on a ``DataProto``, as
  ``RayPPOTrainer.fit`` calls it;
- ``v1``: our hook around ``PPOTrainer._compute_advantage``, on a trainer with only ``config`` set (as
  tests/bv_blend/verl/test_v1_advantage_step.py drives it); TransferQueue is replaced by the step's columns and
  verl's own
  method by the call it ends in (``compute_advantage`` with ``config=self.config.algorithm``), so no Ray starts.

It prints each list and its count. Run it with any checkout on ``PYTHONPATH`` to compare two versions.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                     "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}.items():  # fmt: skip
    os.environ.setdefault(_key, _value)

import numpy as np  # noqa: E402
import torch  # noqa: E402

LEVELS = ("cluster", "prompt_and_cluster")
PATHS = ("legacy", "v1")
K = 3
GROUPS = ((4, 0), (3, 2), (1, 1), (2, 2), (4, 0))  # (rows, cluster) per prompt group
RESPONSE_LEN = 6


def compose(overrides: list[str]):
    """``configs/bv_blend.yaml`` composed with the installed verl's ``ppo_trainer`` (as ``main_ppo`` does)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module("bv_blend.configs", version_base=None):
        return hydra_compose("bv_blend", overrides=overrides)


def step_rows(step: int) -> list[dict]:
    """One step's rows: a uid per prompt, extra_info with the cluster and index, a 0/1 reward on the last token."""
    from bv_blend.codebook import CLUSTER_KEY

    rng = np.random.default_rng(1000 + step)
    rows = []
    for group, (size, cluster) in enumerate(GROUPS):
        uid = f"s{step}g{group}x{rng.integers(1 << 30):08x}"
        for session in range(size):
            length = int(rng.integers(2, RESPONSE_LEN + 1))
            scores = torch.zeros(RESPONSE_LEN)
            scores[length - 1] = float(rng.random() < 0.5)
            mask = torch.zeros(RESPONSE_LEN, dtype=torch.int64)
            mask[:length] = 1
            rows.append({"key": f"{uid}_{session}_0", "uid": uid, "scores": scores, "mask": mask,
                         "extra_info": {CLUSTER_KEY: cluster, "index": group, "split": "train"},
                         "raw_prompt": [{"role": "user", "content": f"problem {group}"}]})  # fmt: skip
    return rows


def columns(rows: list[dict]) -> dict[str, np.ndarray]:
    out = {}
    for name in ("uid", "extra_info", "raw_prompt"):
        out[name] = np.empty(len(rows), dtype=object)
        out[name][:] = [row[name] for row in rows]
    return out


def dataproto(rows: list[dict]):
    from verl import DataProto

    scores = torch.stack([row["scores"] for row in rows])
    return DataProto.from_dict(
        tensors={"token_level_scores": scores, "token_level_rewards": scores.clone(),
                 "response_mask": torch.stack([row["mask"] for row in rows])},  # fmt: skip
        non_tensors=columns(rows),
    )


def legacy_step(config, step: int) -> None:
    from verl.trainer.ppo import ray_trainer

    ray_trainer.compute_advantage(dataproto(step_rows(step)), adv_estimator="bv_blend", config=config.algorithm)


class _Batch:
    """What our V1 hook reads of a ``KVBatchMeta``: its keys (and the partition TransferQueue would be asked)."""

    def __init__(self, rows: list[dict]) -> None:
        self.keys, self.partition_id, self.rows = [row["key"] for row in rows], "train", rows


def v1_step(config, step: int) -> None:
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from bv_blend.verl import hooks

    def fetch(batch, fields):  # TransferQueue's answer: the rows' fields, in batch.keys order
        values = columns(batch.rows)
        return {name: list(values[name]) if name in values else None for name in fields}

    def verl_compute_advantage(self, batch, metrics):  # what verl's _compute_advantage ends in (v1/utils.py)
        return ray_trainer.compute_advantage(dataproto(batch.rows), adv_estimator=self.config.algorithm.adv_estimator,
                                             config=self.config.algorithm)  # fmt: skip

    trainer = object.__new__(PPOTrainerSync)
    trainer.config = config
    hooks._v1_fetch, saved = fetch, hooks._v1_fetch
    try:
        hooks._v1_compute_advantage(verl_compute_advantage)(trainer, _Batch(step_rows(step)), {})
    finally:
        hooks._v1_fetch = saved


def files_of_step(path: str, level: str) -> list[str]:
    """The bv_blend files whose code ran during the second step of a fresh run at ``level`` through ``path``."""
    import bv_blend
    from bv_blend.verl import runtime
    from bv_blend.verl.compositions import check_run

    root = str(Path(bv_blend.__file__).resolve().parent.parent) + os.sep
    package = str(Path(bv_blend.__file__).resolve().parent) + os.sep
    runtime.reset()
    config = compose([f"algorithm.bv_blend.num_clusters={K}", f"algorithm.bv_blend.history_level={level}",
                      "actor_rollout_ref.rollout.n=4", f"trainer.use_v1={path == 'v1'}"])  # fmt: skip
    check_run(config, legacy=path == "legacy")  # what our __init__ hook runs at trainer start
    step = legacy_step if path == "legacy" else v1_step
    step(config, 0)  # warm-up: imports, first builds
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(package):
                seen.add(name)

    sys.setprofile(profile)
    try:
        step(config, 1)
    finally:
        sys.setprofile(None)
    runtime.reset()
    return sorted(str(Path(name).relative_to(root)) for name in seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", nargs="+", default=list(LEVELS), choices=LEVELS)
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    args = parser.parse_args()
    import bv_blend
    import bv_blend.verl.plugin  # noqa: F401  (our hooks on verl's modules, as verl's entry point installs them)

    print(f"bv_blend from {Path(bv_blend.__file__).resolve().parent}")
    for level in args.levels:
        for path in args.paths:
            files = files_of_step(path, level)
            print(f"\n{path} step, history_level={level}: {len(files)} bv_blend files")
            for name in files:
                print(f"  {name}")


if __name__ == "__main__":
    main()
