"""scripts/offline_priors.py end to end on CPU: verl's real trainer in validation-only mode over the training prompts,
its real dump, keyed back to the training rows, and the file the estimators read.

This is the one check that the prompts rendered by bv_blend.verl.offline_priors are exactly those verl writes into
its dump: every one of the dump's samples must match a training row, or the conversion fails. The session's tiny
model, task (128 training rows) and codebook (tests/e2e/_assets.py); 2 samples a prompt. About 4 minutes on 2 cores,
most of it verl's start-up.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from bv_blend.core.jsonl import jsonl_records
from bv_blend.history.priors import load_priors
from bv_blend.verl import offline_priors
from bv_blend.verl.training_data import training_prompts
from instruments.cpu.launch import processes_of_run
from tests._scripts import load_script
from tests.e2e._assets import CpuAssets
from tests.e2e._launch import run_in_suite

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.xdist_group("single_runs")]

SAMPLES = 2


def test_the_script_writes_every_training_prompts_scores_from_verls_dump(cpu_assets: CpuAssets, tmp_path, monkeypatch,
                                                                        capsys) -> None:
    run_id = "e2e-priors-" + tmp_path.name
    real = offline_priors.run_generation
    monkeypatch.setattr(offline_priors, "run_generation", lambda job, log, **kw: real(  # the script's launcher, as
        job, log, **{**kw, "run_id": run_id, "timeout_s": 900, "cpu_launcher": run_in_suite}))  # the suite runs it
    out = tmp_path / "priors.json"
    script = load_script("offline_priors")
    rc = script.main(["--cpu", "--samples", str(SAMPLES), "--out", str(out), *cpu_assets.overrides])
    printed = capsys.readouterr().out
    log = tmp_path / "priors_generations" / "verl.log"
    assert rc == 0, f"exit {rc}; {printed[-2000:]}; see {log}"
    assert processes_of_run(run_id) == [], "processes of the generation run are still alive"

    dump = jsonl_records(tmp_path / "priors_generations" / "0.jsonl")  # verl keeps U+2028 raw: not splitlines()
    rows = 128  # tests/e2e/_assets.py: write_task(n_train=128)
    assert len(dump) == rows * SAMPLES  # the training rows, N samples each: the val-only run saw the training files
    priors = load_priors(out, "test")
    config = OmegaConf.create({"data": {"train_files": [o.split("=", 1)[1] for o in cpu_assets.overrides
                                                        if o.startswith("data.train_files=")]}})
    keys = training_prompts(config, None)
    assert set(priors) == set(keys)  # every training prompt, keyed as the estimators key it, and nothing else
    assert sum(len(v) for v in priors.values()) == rows * SAMPLES
    assert all(set(v.tolist()) <= {0.0, 1.0} for v in priors.values())
    assert f"prompts: {len(keys)} x" in printed and "wall time" in printed
