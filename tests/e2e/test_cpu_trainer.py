"""verl's stock trainer (``python -m verl.trainer.main_ppo``) on CPU with BV-Blend: a real run, then a resume.

Nothing is mocked: the CPU platform of instruments.cpu, FSDP2 on gloo, vLLM-CPU rollouts, TransferQueue and Ray
all run for real, on a tiny locally built Qwen2 model and the demo's arithmetic task, clustered by the packaged
MiniLM encoder. What happened inside the trainer is read back from what verl itself writes: the "file" logger's
JSONL, the rollout dump (``trainer.rollout_data_dir``: every row's prompt and reward) and the checkpoint folders.
Around 8 minutes on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bv_blend import BVBlendConfig, BVBlendEstimator
from instruments.cpu.launch import processes_of_run, run_trainer
from instruments.demo.report import read_metrics
from instruments.machine import describe_cpu
from tests.e2e._assets import CpuAssets, K
from tests.e2e._checks import assert_rollouts_use_fresh_weights

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

FIRST_STEPS = 2
STATE_FILE = "bv_blend_state.pt"  # bv_blend.verl.state.STATE_FILE
EXPECTED_METRICS = ("bv_blend/effective_signal_ratio", "bv_blend/grpo_signal_ratio", "bv_blend/clusters_seen")


@pytest.fixture(scope="module")
def setup(cpu_assets: CpuAssets) -> dict:
    work = cpu_assets.work
    common = [
        *cpu_assets.overrides,
        f"trainer.default_local_dir={work / 'checkpoints'}",
        f"++trainer.rollout_data_dir={work / 'rollouts'}",
        "trainer.resume_mode=auto",
    ]
    run_ids = ["e2e-first-" + work.name, "e2e-second-" + work.name]
    first = run_trainer([*common, f"trainer.total_training_steps={FIRST_STEPS}", f"trainer.save_freq={FIRST_STEPS}"],
                        log_path=work / "first.log", metrics_path=work / "first.jsonl", timeout_s=900,
                        run_id=run_ids[0])
    assert first == 0, f"first run failed (exit {first}); see {work / 'first.log'}"
    second = run_trainer([*common, f"trainer.total_training_steps={FIRST_STEPS + 1}", "trainer.save_freq=1"],
                         log_path=work / "second.log", metrics_path=work / "second.jsonl", timeout_s=900,
                         run_id=run_ids[1])
    assert second == 0, f"resumed run failed (exit {second}); see {work / 'second.log'}"
    return {"work": work, "question_to_cluster": cpu_assets.question_to_cluster, "run_ids": run_ids}


def _rows(work: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (work / "rollouts" / f"{step}.jsonl").read_text().splitlines() if line]


def _cluster_of(prompt: str, question_to_cluster: dict[str, int]) -> int:
    """The cluster the annotated parquet gave this prompt (the dump holds the decoded chat prompt)."""
    hits = [q for q in question_to_cluster if q in prompt]
    assert hits, f"no annotated question inside the dumped prompt {prompt!r}"
    return question_to_cluster[max(hits, key=len)]


def _replay(work: Path, q2c: dict[str, int], saved_config: dict, state: dict | None, steps: range) -> dict:
    """Feeds the dumped rows of ``steps`` (reward, prompt group, annotated cluster) to a real estimator."""
    estimator = BVBlendEstimator(num_clusters=K, config=BVBlendConfig.from_mapping(saved_config))
    if state is not None:
        estimator.load_state_dict(state)
    for step in steps:
        rows = _rows(work, step)
        rewards = torch.tensor([float(r["score"]) for r in rows])
        groups = [r["input"] for r in rows]  # verl's uid is per prompt; the prompt text identifies it in a step
        estimator.compute(rewards, groups, torch.tensor([_cluster_of(r["input"], q2c) for r in rows]))
    return estimator.state_dict()


def _estimator_state(path: Path) -> dict:
    payload = torch.load(path, weights_only=True)
    return payload["estimator"]


def test_bv_blend_metrics_are_in_verls_logged_output(setup: dict) -> None:
    for name in ("first.jsonl", "second.jsonl"):
        metrics = read_metrics(setup["work"] / name)
        missing = [m for m in EXPECTED_METRICS if m not in metrics]
        assert not missing, f"{name}: verl's logged step metrics lack {missing}"
        assert metrics["bv_blend/effective_signal_ratio"].between(0, 1).all()


def test_checkpoint_folder_holds_the_estimator_state(setup: dict) -> None:
    state_path = setup["work"] / "checkpoints" / f"global_step_{FIRST_STEPS}" / STATE_FILE
    assert state_path.is_file(), f"no estimator state in {state_path.parent}: {sorted(state_path.parent.iterdir())}"
    assert _estimator_state(state_path)["num_updates"] == FIRST_STEPS


def test_estimator_saw_each_row_with_its_annotated_cluster(setup: dict) -> None:
    """The clusters whose history the estimator started are exactly those of the prompts it was given.

    A glue that dropped, shifted or defaulted the cluster ids (e.g. all rows in cluster 0 or -1) fails this,
    unless the batch happens to cover the same clusters; the logged count per step is checked as well.
    """
    work, q2c = setup["work"], setup["question_to_cluster"]
    metrics = read_metrics(work / "first.jsonl")
    seen: set[int] = set()
    for step in range(1, FIRST_STEPS + 1):
        seen |= {_cluster_of(row["input"], q2c) for row in _rows(work, step)}
        assert metrics.loc[step, "bv_blend/clusters_seen"] == len(seen), f"step {step}"
    state = _estimator_state(work / "checkpoints" / f"global_step_{FIRST_STEPS}" / STATE_FILE)
    assert set(torch.nonzero(state["seen"]).flatten().tolist()) == seen
    # Per row: replaying every dumped row with its annotated cluster through the real estimator gives the
    # per-cluster history the trainer saved; rows routed to another cluster would move counts between clusters.
    replayed = _replay(work, q2c, saved_config=state["config"], state=None, steps=range(1, FIRST_STEPS + 1))
    for name in ("count", "mean", "second_moment", "seen"):
        assert torch.allclose(replayed[name].double(), state[name].double(), atol=1e-6), name


def test_resumed_process_restored_the_saved_state(setup: dict) -> None:
    """Replays the resumed step on the saved state with the real estimator: it must give the state the new
    process saved after that step. A process that had not restored the state would have started afresh."""
    work, q2c = setup["work"], setup["question_to_cluster"]
    saved = _estimator_state(work / "checkpoints" / f"global_step_{FIRST_STEPS}" / STATE_FILE)
    after = _estimator_state(work / "checkpoints" / f"global_step_{FIRST_STEPS + 1}" / STATE_FILE)
    step = range(FIRST_STEPS + 1, FIRST_STEPS + 2)
    restored = _replay(work, q2c, saved["config"], saved, step)
    fresh = _replay(work, q2c, saved["config"], None, step)
    for name in ("count", "mean", "second_moment", "seen"):
        assert torch.allclose(restored[name].double(), after[name].double(), atol=1e-6), name
    assert not all(torch.equal(fresh[n], after[n]) for n in ("count", "mean")), "test cannot tell resume from fresh"


def test_rollouts_sample_with_the_weights_of_the_last_update(setup: dict) -> None:
    """After each actor update, vLLM's probabilities of the tokens it sampled equal the actor's (fp32 both): verl
    synced the new weights and vLLM computed with them. The resumed run checks the sync of restored weights.
    (tests/e2e/test_cpu_weight_sync.py shows that this check fails on a stale copy.)"""
    first, second = (read_metrics(setup["work"] / name) for name in ("first.jsonl", "second.jsonl"))
    assert first["actor/grad_norm"].iloc[0] > 0, "step 1 made no update (all advantages 0): the check could not tell"
    assert len(first) >= 2, "a single step shows no sync after an update"
    for metrics in (first, second):
        assert_rollouts_use_fresh_weights(metrics)


def test_each_log_names_the_cpu_and_no_process_outlives_its_run(setup: dict) -> None:
    for name, run_id in zip(("first.log", "second.log"), setup["run_ids"], strict=True):
        assert (setup["work"] / name).read_text().splitlines()[0].endswith(describe_cpu()), name
        assert processes_of_run(run_id) == [], f"processes of {name}'s run are still alive"
