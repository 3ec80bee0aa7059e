"""The paper configs (configs/paper/*.yaml, primary configs inheriting configs/bv_blend.yaml) compose with
the installed verl, pass verl's own checks, and fix what the paper fixes.

Composition and validation run verl's real code (hydra on ``ppo_trainer``, ``validate_config``, the config
dataclasses, the cosine LR schedule); nothing here needs a GPU.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from bv_blend.paper.configs import (
    BOOKKEEPING_KEYS,
    COMPARISONS,
    MAIN_CONFIG,
    PAPER_CONFIGS,
    compose_paper_config,
    config_diff,
    paper_config_names,
)

# one worker runs this module: its module fixture is costly, and pytest-xdist would build it again on every
# worker that gets one of its tests (scripts/test.sh: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("paper_configs")

DATA = ["data.train_files=[train.parquet]", "data.val_files=[val.parquet]"]


@pytest.fixture(scope="module")
def composed() -> dict:
    return {name: compose_paper_config(name, DATA) for name in PAPER_CONFIGS}


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_config_passes_verls_own_validation(composed, name):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import FSDPActorConfig, FSDPOptimizerConfig, RolloutConfig

    cfg = composed[name]
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert isinstance(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor), FSDPActorConfig)
    assert isinstance(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.optim), FSDPOptimizerConfig)
    assert isinstance(omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout), RolloutConfig)
    # Every interpolation resolves (verl's own defaults keep a few ??? for features we do not use).
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)


def test_main_config_holds_the_papers_values(composed):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    cfg = composed[MAIN_CONFIG]
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-Math-7B"
    assert cfg.algorithm.adv_estimator == "bv_blend"
    assert cfg.algorithm.bv_blend.gamma == 0.9 and cfg.algorithm.bv_blend.weight_mode == "sem"
    # 16 prompts x 8 rollouts = 128 trajectories per step; verl counts the mini-batch in prompts.
    assert cfg.data.train_batch_size == 16 and rollout.n == 8
    assert actor.ppo_mini_batch_size * rollout.n == 64
    assert rollout.temperature == 1.0 and rollout.name == "vllm"
    assert actor.optim.optimizer == "AdamW" and actor.optim.lr == 1e-6
    assert actor.optim.lr_scheduler_type == "cosine" and actor.optim.lr_warmup_steps_ratio > 0
    assert actor.clip_ratio == actor.clip_ratio_low == actor.clip_ratio_high == 0.2
    assert actor.entropy_coeff == 0.01
    assert not actor.use_kl_loss and actor.kl_loss_coef == 0.0 and not cfg.algorithm.use_kl_in_reward
    assert not need_reference_policy(cfg) and not need_critic(cfg)
    assert cfg.trainer.total_training_steps == 500
    assert cfg.trainer.n_gpus_per_node == 8 and cfg.trainer.nnodes == 1
    assert actor.strategy in ("fsdp", "fsdp2") and cfg.actor_rollout_ref.ref.strategy == actor.strategy
    assert cfg.reward.custom_reward_function.path == "pkg://bv_blend.paper.rewards"
    assert cfg.reward.custom_reward_function.name == "compute_score"
    assert "tensorboard" in cfg.trainer.logger and "file" in cfg.trainer.logger
    assert rollout.val_kwargs.temperature == 0.6 and rollout.val_kwargs.top_p == 1.0


# The context of the model each config is meant for: Qwen2.5-Math's 16k-window copy (scripts/widen_context.py) for
# the main run and everything that inherits it, the stock 4096 for the _4k variant, the instruct models' own.
MODEL_CONTEXT = {"qwen25_math_7b_4k": 4096, "qwen25_7b_instruct": 32768, "llama31_8b_instruct": 131072}
WIDENED_CONTEXT = 16384


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_lengths_and_token_budgets_fit_the_model(composed, name, tmp_path):
    from bv_blend.verl.context_budget import check_context_budget

    cfg = composed[name]
    context = MODEL_CONTEXT.get(name, WIDENED_CONTEXT)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": context}))
    assert check_context_budget(cfg, model).tokens == context  # the launch check passes on the intended model
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert rollout.max_model_len == longest  # vLLM's window is the budget, no more
    # With dynamic batching one full-length sequence must fit a micro-batch's token budget ...
    assert actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu >= longest
    assert rollout.log_prob_max_token_len_per_gpu >= longest
    # ... and without it the fallback micro-batches must stay within the same token envelopes.
    assert actor.ppo_micro_batch_size_per_gpu * longest <= actor.ppo_max_token_len_per_gpu
    assert rollout.log_prob_micro_batch_size_per_gpu * longest <= rollout.log_prob_max_token_len_per_gpu
    # Each GPU must get whole trajectories of a mini-batch: 64 trajectories over 8 GPUs.
    assert (actor.ppo_mini_batch_size * rollout.n) % cfg.trainer.n_gpus_per_node == 0
    assert cfg.trainer.n_gpus_per_node % rollout.tensor_model_parallel_size == 0


def test_main_run_has_the_papers_generation_budget_and_the_4k_variant_the_stock_models(composed):
    main, short = composed[MAIN_CONFIG], composed["qwen25_math_7b_4k"]
    assert (main.data.max_prompt_length, main.data.max_response_length) == (1024, 8192)
    assert main.actor_rollout_ref.rollout.max_model_len == 9216
    assert (short.data.max_prompt_length, short.data.max_response_length) == (1024, 3072)
    assert short.actor_rollout_ref.rollout.max_model_len == 4096
    assert main.actor_rollout_ref.actor.optim.clip_grad == short.actor_rollout_ref.actor.optim.clip_grad == 1.0


def test_reward_function_loads_through_verls_loader(composed):
    from verl.utils.import_utils import load_extern_object

    fn_cfg = composed[MAIN_CONFIG].reward.custom_reward_function
    fn = load_extern_object(fn_cfg.path, fn_cfg.name)
    assert fn("openr1", "so the answer is \\boxed{4}", "4")["score"] == 1.0
    assert fn("openr1", "so the answer is \\boxed{5}", "4")["score"] == 0.0


def test_lr_schedule_is_linear_warmup_then_cosine_with_verls_scheduler(composed):
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup

    optim = composed[MAIN_CONFIG].actor_rollout_ref.actor.optim
    steps = composed[MAIN_CONFIG].trainer.total_training_steps
    warmup = int(optim.lr_warmup_steps_ratio * steps)  # what verl's FSDP engine computes
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=optim.lr)
    sched = get_cosine_schedule_with_warmup(opt, warmup, steps, min_lr_ratio=optim.min_lr_ratio)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0 and lrs[warmup // 2] == pytest.approx(optim.lr * (warmup // 2) / warmup)
    assert lrs[warmup] == pytest.approx(optim.lr)
    assert lrs[warmup + (steps - warmup) // 2] == pytest.approx(optim.lr * 0.5, rel=1e-2)
    assert lrs[-1] < 1e-3 * optim.lr and all(a >= b for a, b in zip(lrs[warmup:-1], lrs[warmup + 1 :], strict=True))


@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_comparison_changes_only_what_it_names(composed, name):
    _, allowed = COMPARISONS[name]
    raw = config_diff(composed[MAIN_CONFIG], composed[name])
    assert set(raw) - BOOKKEEPING_KEYS <= allowed, f"{name} changes more than it names: {sorted(raw)}"
    named = {key for key in allowed if key in raw}
    assert named, f"{name} changes none of {sorted(allowed)}"
    assert composed[name].trainer.experiment_name != composed[MAIN_CONFIG].trainer.experiment_name


def test_comparisons_set_the_named_values(composed):
    assert composed["grpo"].algorithm.adv_estimator == "grpo"
    fixed = composed["fixed_w"].algorithm.bv_blend
    assert fixed.weight_mode == "fixed" and fixed.fixed_weight == 0.5
    assert composed["neff"].algorithm.bv_blend.weight_mode == "neff"
    assert composed["sigma"].algorithm.bv_blend.weight_mode == "sigma"
    rpp = composed["reinforce_pp_n1"]  # the main run's 128 rollouts a step, one per prompt, 2 updates a step
    assert rpp.algorithm.adv_estimator == "reinforce_plus_plus"
    budget = rpp.actor_rollout_ref.rollout.n, rpp.data.train_batch_size, rpp.actor_rollout_ref.actor.ppo_mini_batch_size
    assert budget == (1, 128, 64)
    literal, main = composed["literal"].algorithm.bv_blend, composed[MAIN_CONFIG].algorithm.bv_blend
    assert (literal.variance_floor, literal.max_abs_advantage) == ("none", None)  # the paper's formulas
    assert (main.variance_floor, main.max_abs_advantage) == ("prior", "auto")  # the recipe keeps the safe defaults
    paths = {name: composed[name].actor_rollout_ref.model.path for name in COMPARISONS}
    assert paths["qwen25_math_1p5b"] == "Qwen/Qwen2.5-Math-1.5B"
    assert paths["qwen25_7b_instruct"] == "Qwen/Qwen2.5-7B-Instruct"
    assert paths["llama31_8b_instruct"] == "meta-llama/Llama-3.1-8B-Instruct"


def test_every_config_in_the_folder_is_registered():
    assert sorted(PAPER_CONFIGS) == paper_config_names()


def test_main_run_is_the_base_config_plus_the_papers_settings(composed):
    """The experiment config sits on configs/bv_blend.yaml: BV-Blend's options come from the base unchanged."""
    base = compose_paper_config(None, DATA)
    diff = config_diff(base, composed[MAIN_CONFIG])
    assert not [key for key in diff if key.startswith("algorithm.bv_blend.")]
    assert diff["data.train_batch_size"] == (base.data.train_batch_size, 16)


def test_config_diff_reports_changed_and_added_keys():
    a = OmegaConf.create({"x": 1, "y": {"z": 2}})
    b = OmegaConf.create({"x": 1, "y": {"z": 3, "w": 4}})
    assert config_diff(a, b) == {"y.z": (2, 3), "y.w": (None, 4)}


def test_unknown_config_name_is_a_clear_error():
    with pytest.raises(ValueError, match="qwen25_math_7b"):
        compose_paper_config("does_not_exist")


def test_warmup_ratio_gives_whole_steps(composed):
    optim = composed[MAIN_CONFIG].actor_rollout_ref.actor.optim
    warmup = optim.lr_warmup_steps_ratio * composed[MAIN_CONFIG].trainer.total_training_steps
    assert math.isclose(warmup, round(warmup))


def test_each_paper_config_says_what_it_reduces_to_at_the_papers_scale(capsys):
    """scripts/paper_visits.py on the real composed configs, at OpenR1-Math's 45,000 prompts: the main run visits
    a prompt 0.18 times (16 x 500 / 45,000), so no row has a prompt history; SPO at 128 prompts a step comes back
    after step 352 (0.42 / 1.42 of its rows); the priors config acts on every row."""
    from tests._scripts import load_script

    assert load_script("paper_visits").main(["qwen25_math_7b", "spo", "bv_blend_n2", "bv_blend_n2_priors"]) == 0
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| `paper/")}  # fmt: skip
    assert rows["paper/qwen25_math_7b"][4:6] == ["0.18", "0.00"]
    assert "the cluster level (the codebook)" in rows["paper/qwen25_math_7b"][6]
    assert rows["paper/spo"][4:6] == ["1.42", "0.30"]
    assert rows["paper/bv_blend_n2"][4:6] == ["0.71", "0.00"]  # the cluster level: the measured arm (issue 37)
    assert "the cluster level (the codebook), as configured" in rows["paper/bv_blend_n2"][6]
    assert rows["paper/bv_blend_n2_priors"][5] == "1.00"
