"""verl's own entry point finds our configs by name, through the hydra plugin bv_blend ships.

Each config is composed by verl's real ``main_ppo`` in a fresh process, with hydra's ``--cfg job``, which prints the
job config and exits before Ray or any model starts. One process runs ``main_ppo``'s hydra entry once per config
(importing verl dominates the time); the shortest command, ``python -m verl.trainer.main_ppo --config-name
bv_blend``, also runs exactly as a user types it. The subprocesses get this checkout on ``PYTHONPATH``, like the
test process itself: what is tested is this checkout's plugin and configs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bv_blend import BVBlendConfig
from bv_blend.paper.configs import BOOKKEEPING_KEYS, COMPARISONS, MAIN_CONFIG, PAPER_CONFIGS, config_diff
from bv_blend.verl.glue.bv_blend import BVBlendOptions

# one worker runs this module: its module fixture is costly, and pytest-xdist would build it again on every
# worker that gets one of its tests (scripts/test.sh: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("configs_by_name")

ROOT = Path(__file__).resolve().parents[3]
SEPARATOR = "=== bv_blend config: "
RUN_EACH = f"""
import sys
from hydra.core.global_hydra import GlobalHydra
from verl.trainer import main_ppo

for name in sys.argv[1:]:
    GlobalHydra.instance().clear()
    sys.argv = ["main_ppo", "--config-name", name, "--cfg", "job"]
    print("{SEPARATOR}" + name, flush=True)
    main_ppo.main()
"""


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def job_configs(tmp_path_factory) -> dict:
    """``--cfg job`` of every config, composed by main_ppo in one fresh process started outside the checkout."""
    names = ["bv_blend", "cpu_tiny", *(f"paper/{name}" for name in PAPER_CONFIGS)]
    result = subprocess.run(
        [sys.executable, "-c", RUN_EACH, *names], cwd=tmp_path_factory.mktemp("cwd"), env=_env(),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    chunks = result.stdout.split(SEPARATOR)[1:]
    configs = {}
    for chunk in chunks:
        name, _, text = chunk.partition("\n")
        configs[name] = OmegaConf.create(text)
    assert sorted(configs) == sorted(names)
    return configs


@pytest.mark.slow
def test_the_shortest_command_composes_bv_blend_on_verls_ppo_trainer(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "--config-name", "bv_blend", "--cfg", "job",
         "algorithm.bv_blend.num_clusters=64", "algorithm.bv_blend.temperature=0.2"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    config = OmegaConf.create(result.stdout)
    assert config.algorithm.adv_estimator == "bv_blend"
    assert config.actor_rollout_ref.rollout.n is not None and config.trainer.resume_mode == "auto"  # verl's keys
    glue = BVBlendOptions.from_algorithm(config.algorithm)
    estimator = glue.config
    assert estimator == BVBlendConfig(temperature=0.2) and glue == BVBlendOptions(config=estimator, num_clusters=64)


@pytest.mark.slow
def test_bv_blend_config_declares_every_option_with_the_code_defaults(job_configs):
    glue = BVBlendOptions.from_algorithm(job_configs["bv_blend"].algorithm)
    estimator = glue.config
    assert estimator == BVBlendConfig() and glue == BVBlendOptions(config=estimator)
    # from_algorithm fills a missing key with its default: the key set shows one left undeclared
    assert set(job_configs["bv_blend"].algorithm.bv_blend) == set(BVBlendOptions.defaults())


@pytest.mark.slow
def test_the_papers_main_run_is_one_name(job_configs):
    config = job_configs[f"paper/{MAIN_CONFIG}"]
    assert config.algorithm.adv_estimator == "bv_blend" and config.algorithm.bv_blend.gamma == 0.9
    assert config.actor_rollout_ref.model.path == "Qwen/Qwen2.5-Math-7B"
    assert config.data.train_batch_size == 16 and config.actor_rollout_ref.rollout.n == 8
    assert config.trainer.total_training_steps == 500 and config.trainer.n_gpus_per_node == 8
    assert config.reward.custom_reward_function.path == "pkg://bv_blend.paper.rewards"
    # The paper's keys sit at the top of the config, where main_ppo reads them (not under a "paper" key).
    assert "paper" not in config


@pytest.mark.slow
def test_the_16k_main_run_and_the_4k_variant_compose_with_their_lengths(job_configs):
    main, short = job_configs[f"paper/{MAIN_CONFIG}"], job_configs["paper/qwen25_math_7b_4k"]
    assert (main.data.max_prompt_length, main.data.max_response_length) == (1024, 8192)
    assert main.actor_rollout_ref.rollout.max_model_len == 9216
    assert main.actor_rollout_ref.actor.optim.clip_grad == 1.0
    assert (short.data.max_response_length, short.actor_rollout_ref.rollout.max_model_len) == (3072, 4096)
    assert short.actor_rollout_ref.model.path == main.actor_rollout_ref.model.path  # same weights, stock window


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_each_comparison_is_one_name_and_changes_only_what_it_names(job_configs, name):
    _, allowed = COMPARISONS[name]
    diff = config_diff(job_configs[f"paper/{MAIN_CONFIG}"], job_configs[f"paper/{name}"])
    assert set(diff) - BOOKKEEPING_KEYS <= allowed and set(diff) & allowed, sorted(diff)


@pytest.mark.slow
def test_companion_configs_hold_their_papers_settings(job_configs):
    """configs/paper/{ha_dw,maxnorm_rloo,ntf_rfpp,bv_blend_ntf}.yaml as main_ppo composes them (docs/companions.md)."""
    from bv_blend.companions import HADWConfig, MaxNormConfig
    from bv_blend.verl.glue import ha_dw
    from bv_blend.verl.glue import maxnorm_ac as maxnorm
    from bv_blend.verl.glue.ntf import TARGET

    hadw = job_configs["paper/ha_dw"]
    assert hadw.algorithm.adv_estimator == "ha_dw" and hadw.actor_rollout_ref.rollout.n == 8
    # every key declared = its default
    assert ha_dw.HADWOptions.from_algorithm(hadw.algorithm).config == HADWConfig(lambda_scale=1.3)
    assert set(hadw.algorithm.ha_dw) == set(ha_dw.HADWOptions.defaults())
    rloo = job_configs["paper/maxnorm_rloo"]
    assert rloo.algorithm.adv_estimator == "maxnorm_ac" and rloo.actor_rollout_ref.rollout.n == 16
    rloo_options = maxnorm.MaxNormOptions.from_algorithm(rloo.algorithm)
    assert rloo_options.config == MaxNormConfig(numerator="rloo", delta_res=0.01)
    assert set(rloo.algorithm.maxnorm) == set(maxnorm.MaxNormOptions.defaults())
    for name, estimator in (("ntf_rfpp", "reinforce_plus_plus"), ("bv_blend_ntf", "bv_blend")):
        config = job_configs[f"paper/{name}"]
        loss = config.actor_rollout_ref.actor.policy_loss
        assert config.algorithm.adv_estimator == estimator and config.actor_rollout_ref.rollout.n == 1
        assert (loss._target_, loss.loss_mode, loss.ntf_keep_ratio) == (TARGET, "ntf", 0.1)
    # Every companion run keeps the main run's 128 trajectories per step.
    for name in ("ha_dw", "maxnorm_rloo", "ntf_rfpp", "bv_blend_ntf"):
        config = job_configs[f"paper/{name}"]
        assert config.data.train_batch_size * config.actor_rollout_ref.rollout.n == 128, name


@pytest.mark.slow
def test_the_cpu_config_extends_bv_blend_by_name(job_configs):
    """What instruments.cpu.launch runs: BV-Blend with every option at its default, plus what CPU needs."""
    config = job_configs["cpu_tiny"]
    glue = BVBlendOptions.from_algorithm(config.algorithm)
    estimator = glue.config
    assert estimator == BVBlendConfig() and glue == BVBlendOptions(config=estimator)
    assert set(config.algorithm.bv_blend) == set(BVBlendOptions.defaults())
    assert config.actor_rollout_ref.actor.strategy == "fsdp2" and config.actor_rollout_ref.rollout.dtype == "float32"
    assert config.actor_rollout_ref.rollout.calculate_log_probs is True and config.trainer.device == "cpu"
    assert config.ray_kwargs.ray_init.num_gpus == 1
