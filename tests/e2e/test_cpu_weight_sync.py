"""The weight sync between verl's actor and vLLM-CPU, under a deliberate fault (tests/e2e/weight_sync_faults.py).

- A broken sync: vLLM's worker raises while loading the weights of a sync. The run must exit non-zero within two
  minutes of the failure, name the cause, record no step after it, and leave no process behind. The fault rides on
  the resumed process of the session's SPO history run, on verl's legacy trainer (tests/e2e/_history.py): it trains
  and saves step 3, then trains and saves step 4, whose sync fails. Until this round the fault broke the start-up
  sync of a V1 run of its own; the V1 trainer's sync deadline is also met by test_cpu_engine_death.py's kill
  before a sync.
- A stale copy (syncs after start-up acknowledged but not loaded) is the other fault of that module: its check rides
  on the NTF run of test_cpu_ntf.py, which trains on healthy code paths while vLLM keeps the step-0 weights.
"""

from __future__ import annotations

import pytest

from instruments.cpu.launch import processes_of_run
from instruments.run.report import read_metrics
from tests.e2e._history import LAST_STEP, HistoryRun
from tests.e2e._launch import FAIL_FAST_S
from tests.e2e.weight_sync_faults import failing_sync


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(4200)
@pytest.mark.xdist_group("history")
def test_a_broken_weight_sync_ends_the_run_quickly_and_names_the_cause(spo_run: HistoryRun) -> None:
    done = spo_run.second
    assert done.rc != 0, "a run whose weight sync failed must not exit 0"
    assert done.after_fault_s is not None, f"the injected failure never reached the log; see {done.log}"
    assert done.after_fault_s < FAIL_FAST_S, f"the run took {done.after_fault_s:.0f} s to end after the failure"
    text = done.text()
    assert "WeightSyncTimeout" in text and "failed to load the actor's weights" in text, "the error must name the cause"
    # verl's legacy trainer logs a step after its weight sync: step 4 trained and was saved, and is not logged
    steps = list(read_metrics(done.metrics).index)
    assert steps == [LAST_STEP], f"steps recorded: {steps}; none may follow the failed sync"
    assert processes_of_run(done.run_id) == [], "processes of the failed run are still alive"


def test_the_fault_names_its_sync_and_a_malformed_setting_names_the_forms() -> None:
    assert (failing_sync("fail:1"), failing_sync("fail:3"), failing_sync("stale")) == (1, 3, None)
    for setting in ("fail", "fail:0", "fail:x", "stal"):
        with pytest.raises(ValueError, match="use 'stale', or 'fail:N'"):
            failing_sync(setting)
