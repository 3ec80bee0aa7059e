"""The session's run of verl's stock trainer on CPU with a real pretrained LM, and the two faults it carries.

SmolLM2-135M-Instruct (prepared offline as the demo prepares it), BV-Blend's cluster level at one rollout per prompt
with one cluster, and the ``ntf`` loss (test_cpu_ntf.py says why this pairing). It trains ``STEPS`` steps that the
tests read, and one more that its end-of-run fault ends:

- ``stale`` (tests/e2e/weight_sync_faults.py): after start-up every sync is acknowledged but not loaded, so vLLM
  keeps sampling with the step-0 weights, which the freshness check must reject (test_cpu_ntf.py);
- ``kill_before_sync`` (tests/e2e/engine_faults.py): once step ``STEPS + 1`` has trained, its weight sync reaches a
  worker that kills vLLM's engine core and itself: no request fails, and the sync deadline must end the run
  (test_cpu_engine_death.py; a run of the tiny model of its own until this round).

Neither fault changes what the other's checks read: the NTF, BV-Blend and freshness checks read steps 1 to ``STEPS``,
which verl logs after each step's closing sync, before the death.
"""

from __future__ import annotations

from tests.e2e._assets import CpuAssets, pretrained_overrides
from tests.e2e._launch import Fault, Launch, launch
from tests.e2e.engine_faults import FAULT_ENV as ENGINE_FAULT_ENV
from tests.e2e.engine_faults import INJECTED_FAULT as ENGINE_FAULT_MARKER
from tests.e2e.weight_sync_faults import FAULT_ENV as SYNC_FAULT_ENV

STEPS = 4  # a negative needs a success in an earlier step: ~25% of rollouts succeed, so P(none in 24) < 1%
KEEP_RATIO = 0.1
STALE = Fault("tests.e2e.weight_sync_faults", SYNC_FAULT_ENV, "stale")
# sync s + 1 follows step s's update: this one follows step STEPS + 1's, the step after the last one the tests read
DEATH_BEFORE_LAST_SYNC = Fault("tests.e2e.engine_faults", ENGINE_FAULT_ENV, f"kill_before_sync:{STEPS + 2}",
                               ENGINE_FAULT_MARKER)  # fmt: skip


def run_ntf(assets: CpuAssets) -> Launch:
    work = assets.work
    overrides = [
        *pretrained_overrides(work, num_clusters=1),  # BV-Blend, SmolLM2 on the demo's task, one cluster
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.actor.policy_loss._target_=bv_blend.verl.glue.ntf.NTFPolicyLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=ntf",
        f"++actor_rollout_ref.actor.policy_loss.ntf_keep_ratio={KEEP_RATIO}",
        f"trainer.total_training_steps={STEPS + 1}",
        f"trainer.default_local_dir={work / 'ntf_checkpoints'}",
        "trainer.resume_mode=disable",
        "trainer.experiment_name=ntf",
    ]
    return launch(overrides, work / "ntf.log", work / "ntf.jsonl", "e2e-ntf-" + work.name,
                  faults=(STALE, DEATH_BEFORE_LAST_SYNC), timeout_s=1800)  # fmt: skip
