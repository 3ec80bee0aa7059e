"""What a run of the companion methods checks before any worker starts: options, and the compositions of spec
section 4, refused with the reason.

In-process tests call verl's real trainer constructors (``PPOTrainerSync``, ``RayPPOTrainer``), patched by our
plugin: the check fails them before verl's own ``__init__`` (which would start Ray workers on GPUs) runs. Each paper
config is composed once; a case adds its keys as a ``+key=value`` override would. The last tests start fresh
interpreters: verl's ``main_ppo`` composing a misspelt option, and the plugin loaded by
``import verl`` alone refusing one at trainer start.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.v1 import trainer_sync

from bv_blend.paper.configs import compose_paper_config
from bv_blend.verl.compositions import check_run

# one worker runs this module: its module fixture is costly, and pytest-xdist would build it again on every
# worker that gets one of its tests (scripts/test.sh: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("companion_trainer_start")


ROOT = Path(__file__).resolve().parents[3]
DATA = ["data.train_files=[train.parquet]", "data.val_files=[val.parquet]"]
K = {"algorithm.bv_blend.num_clusters": 4}


@functools.cache
def _composed(name: str):
    return compose_paper_config(name, DATA)  # hydra composition takes seconds here: once per config


def _config(name: str, updates: dict[str, Any]):
    """A composed paper config with ``updates`` applied (new keys added, as a ``+key=value`` override would)."""
    config = copy.deepcopy(_composed(name))
    for key, value in updates.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


def _start(name: str, updates: dict[str, Any], legacy: bool = False) -> None:
    config = _config(name, updates)
    if legacy:
        ray_trainer.RayPPOTrainer(config, None, None, None)
    else:
        trainer_sync.PPOTrainerSync(config)


@pytest.mark.parametrize(
    ("name", "updates", "match"),
    [
        ("qwen25_math_7b", {**K, "algorithm.filter_groups.enable": True},
         r"(?s)filter_groups.enable=true evicts.*deletes exactly the groups BV-Blend exists for"),
        ("qwen25_math_7b", {**K, "algorithm.maxnorm.delta_res": 0.05},
         "deletes exactly the groups BV-Blend exists for"),
        ("qwen25_math_7b", {**K, "algorithm.ha_dw.mode": "kalman"},
         r"(?s)algorithm.ha_dw.\{mode\} asks.*partly cancel"),
        ("maxnorm_rloo", {"algorithm.ha_dw.lambda_scale": 2.0}, r"breaks the bound \|A\| <= 1"),
        ("maxnorm_rloo", {"algorithm.use_kl_in_reward": True}, "leave the reward grid that the RRP bins on"),
        ("grpo", {"algorithm.maxnorm.skip_zero_gap": False}, "has no RRP stage"),
        ("grpo", {"algorithm.ha_dw.lambda_scale": 2.0},
         r"adv_estimator=grpo would ignore.*algorithm.ha_dw.\{lambda_scale\} acts only with .*=ha_dw"),
        ("ha_dw", {"algorithm.ha_dw.lamda_scale": 1.5}, r"Unknown option\(s\) algorithm.ha_dw.\{lamda_scale\}"),
        ("ha_dw", {"algorithm.ha_dw.mode": "kalmann"}, "algorithm.ha_dw.mode='kalmann' is invalid"),
        ("maxnorm_rloo", {"algorithm.maxnorm.delta_res": 2.0}, r"algorithm.maxnorm.delta_res=2.0 is invalid"),
        ("grpo", {"algorithm.bv_blend.bounded_scale_tau": 0.01},
         r"(?s)bounded_scale_tau is set, but it bounds only bv_blend's scale.*maxnorm_ac is bounded already"),
        ("qwen25_math_7b", {**K, "algorithm.bv_blend.bounded_scale_tau": -1.0},
         r"bounded_scale_tau=-1.0 is invalid: it must be a finite number >= 0"),
    ],
)  # fmt: skip
def test_trainer_start_refuses_bad_options_and_unsound_stacks(name, updates, match):
    with pytest.raises(ValueError, match=match):
        _start(name, updates)


def test_legacy_bypass_mode_would_swap_the_ntf_loss_and_is_refused():
    bypass = {"algorithm.rollout_correction.bypass_mode": True}
    with pytest.raises(ValueError, match="bypass mode replaces the policy loss"):
        _start("ntf_rfpp", bypass, legacy=True)
    # The V1 trainer keeps the configured loss in bypass mode (it only swaps the old log-probs): allowed.
    check_run(_config("ntf_rfpp", bypass))


@pytest.mark.parametrize(
    ("name", "updates"),
    [
        ("ha_dw", {}),
        ("maxnorm_rloo", {}),
        ("ntf_rfpp", {}),
        ("bv_blend_ntf", K),  # the sound composition: BV-Blend at rollout.n=1 with NTF
        ("qwen25_math_7b", {**K, "algorithm.bv_blend.bounded_scale_tau": 0.01}),  # bounded BV-Blend
        ("ha_dw", {"algorithm.adv_estimator": "grpo"}),  # the declared defaults request nothing
        ("ntf_rfpp", {"algorithm.adv_estimator": "rloo"}),  # NTF composes with any estimator
    ],
)
def test_sound_runs_pass(name, updates):
    check_run(_config(name, updates))


def test_the_papers_reward_without_math_verify_is_refused_at_trainer_start(monkeypatch):
    """reinforce_pp_n1 (verl's estimator, the paper kit's reward): without math-verify the run would fail at its first
    validation, after the model loaded. The refusal names the extra that installs it. (math-verify is installed
    here: its absence is what find_spec reports for a module not found.)"""
    import importlib.util

    config = _config("reinforce_pp_n1", {})
    check_run(config)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name, *a))
    with pytest.raises(ValueError, match=r"needs math-verify.*pip install '\.\[paper\]'"):
        _start("reinforce_pp_n1", {})


# ------------------------------------------------------------------------------------------- a fresh process
FRESH = """
import contextlib, io, json, sys
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
import verl  # loads bv_blend's plugin through the entry point; nothing of ours is imported by hand
from verl.trainer import main_ppo
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import validate_config

out = {}
# 1. verl's own entry point composing a misspelt (undeclared) option
sys.argv = ["main_ppo", "--config-name", "paper/ha_dw", "--cfg", "job", "algorithm.ha_dw.lamda_scale=1.5"]
stdout, stderr = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
    try:
        main_ppo.main()
        out["main_ppo"] = (0, stdout.getvalue(), stderr.getvalue())
    except SystemExit as exc:
        out["main_ppo"] = (exc.code, stdout.getvalue(), stderr.getvalue())
# 2. a misspelt option added with "+": refused where the run starts
cases = {
    "ha_dw_misspelt": ("paper/ha_dw", ["+algorithm.ha_dw.lamda_scale=1.5"]),
    "ntf_misspelt": ("paper/ntf_rfpp", ["+actor_rollout_ref.actor.policy_loss.ntf_keep_ratoi=0.2"]),
}
for case, (name, overrides) in cases.items():
    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose(name, overrides=["data.train_files=[a]", "data.val_files=[b]", *overrides])
    try:
        if case == "ha_dw_misspelt":
            PPOTrainerSync(config)
        else:
            validate_config(config, use_reference_policy=False, use_critic=False)  # verl's driver-side check
        out[case] = "no error"
    except Exception as exc:
        out[case] = f"{type(exc).__name__}: {exc}"
out["loaded"] = sorted(m for m in sys.modules if m.startswith("bv_blend.verl."))
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict:
    """One fresh interpreter started outside the checkout, with this checkout on PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", FRESH], cwd=tmp_path_factory.mktemp("cwd"),
        env={**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0 and "RESULT" in result.stdout, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT")[-1])


@pytest.mark.slow
def test_main_ppo_names_a_misspelt_option(fresh):
    """Every option is declared in the comparison config, so hydra itself refuses a key that is not one."""
    code, stdout, stderr = fresh["main_ppo"]
    assert code != 0 and "lamda_scale" in stderr and "ha_dw" in stderr, stderr[-2000:]
    assert "algorithm:" not in stdout  # no job config was printed


@pytest.mark.slow
def test_plugin_alone_refuses_misspelt_options_in_a_fresh_process(fresh):
    assert fresh["ha_dw_misspelt"].startswith("ValueError: Unknown option(s) algorithm.ha_dw.{lamda_scale}")
    assert "unexpected keyword argument 'ntf_keep_ratoi'" in fresh["ntf_misspelt"]
    assert "bv_blend.verl.plugin" in fresh["loaded"] and "bv_blend.verl.glue.ntf" in fresh["loaded"]
