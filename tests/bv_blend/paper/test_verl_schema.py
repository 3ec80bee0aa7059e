"""Every key our configs set is one verl 0.9.1 declares and reads (tests/_verl_schema.py, run on the real verl).

Each config is composed by name as verl's ``main_ppo`` composes it (hydra, verl's config module, bv_blend's
search-path plugin); the keys checked are those our files in its defaults list set plus every key whose composed
value differs from verl's own ``ppo_trainer``. The schema is that ``ppo_trainer``, composed from the installed
package; the reads are found in verl's installed source. Nothing here is mocked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bv_blend.paper.configs import paper_config_names
from tests._verl_schema import check_file, check_job, check_key, job_keys, keys_set_by, read_sites, verl_schema

# One worker: verl's schema and its read sites (an AST pass over the installed verl) cost each process ~12 s to build.
pytestmark = pytest.mark.xdist_group("verl_schema")

REPO = Path(__file__).resolve().parents[3]
# Every primary config verl finds by name: the base, the CPU one, and whatever sits in configs/paper/ (new files
# included).
CONFIG_NAMES = ["bv_blend", "cpu_tiny", *(f"paper/{name}" for name in paper_config_names())]


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_every_key_a_config_sets_is_declared_and_read_by_verl(name):
    keys = job_keys(name)
    assert "algorithm.adv_estimator" in keys, f"{name}: the check would pass vacuously ({keys})"
    findings = check_job(name)
    assert findings == [], "\n".join(map(str, findings))


def test_keys_come_from_the_whole_defaults_chain_even_at_verls_own_value():
    keys = job_keys("paper/grpo")
    # set in the parent qwen25_math_7b.yaml, to 1.0, which is also verl's default: only the file chain shows it
    assert verl_schema().actor_rollout_ref.actor.optim.clip_grad == 1.0
    assert "actor_rollout_ref.actor.optim.clip_grad" in keys
    assert "algorithm.adv_estimator" in keys and "algorithm.bv_blend.gamma" in keys
    assert "actor_rollout_ref.actor.grad_clip" not in keys  # moved to optim.clip_grad (issue 14)


def test_an_override_that_sets_a_dead_key_is_caught():
    findings = check_job("paper/qwen25_math_7b", ["actor_rollout_ref.actor.grad_clip=0.5"])
    assert [(f.key, f.kind) for f in findings] == [("actor_rollout_ref.actor.grad_clip", "unread")]


def test_grad_clip_is_declared_but_unread_and_clip_grad_is_read():
    finding = check_key("actor_rollout_ref.actor.grad_clip")
    assert finding is not None and finding.kind == "unread"
    assert "FSDPActorConfig" in finding.detail
    # the optimizer's own deprecated `self.grad_clip` (OptimizerConfig) is not a read of the actor's key ...
    assert not read_sites("actor_rollout_ref.actor.grad_clip")
    # ... while the real key has read sites in verl's engines
    assert check_key("actor_rollout_ref.actor.optim.clip_grad") is None
    assert any("engine" in site.file for site in read_sites("actor_rollout_ref.actor.optim.clip_grad"))


@pytest.mark.parametrize(
    ("key", "kind", "says"),
    [
        ("actor_rollout_ref.actor.clip_ratioo", "unknown", "no 'clip_ratioo' under actor_rollout_ref.actor"),
        ("actor_rollout_ref.actor.optim.grad_norm", "unknown", "no 'grad_norm'"),
        ("trainer.total_training_step", "unknown", "no 'total_training_step' under trainer"),
        ("nonsense.key", "unknown", "no 'nonsense' under <root>"),
        ("algorithm.bv_blend.gama", "unknown", "not a bv_blend option"),
        ("algorithm.ha_dw.lamda_scale", "unknown", "not a bv_blend option of algorithm.ha_dw"),
        ("algorithm.maxnorm.delta_ress", "unknown", "not a bv_blend option of algorithm.maxnorm"),
        ("actor_rollout_ref.actor.policy_loss.ntf_keep_ratoi", "unknown", "no 'ntf_keep_ratoi'"),
        # a ++ key that is not a field of the section's dataclass either
        ("actor_rollout_ref.rollout.enable_sleep_modee", "unknown", "no 'enable_sleep_modee'"),
        ("actor_rollout_ref.actor.fsdp_config.mixed_precisionn.param_dtype", "unknown", "no 'mixed_precisionn'"),
    ],
)
def test_misspelled_keys_are_caught(key, kind, says):
    finding = check_key(key)
    assert finding is not None and finding.kind == kind and says in finding.detail


@pytest.mark.parametrize(
    "key",
    [
        "actor_rollout_ref.actor.clip_ratio_c",
        "actor_rollout_ref.rollout.max_model_len",
        "data.max_response_length",
        "algorithm.bv_blend.gamma",
        "algorithm.bv_blend.allow_state_reset",
        # free-form mappings verl passes on as they are
        "actor_rollout_ref.model.override_config.max_position_embeddings",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides.max_position_embeddings",
        # not in verl's yaml, but fields of the section's dataclass (read), and a dict field's contents
        "actor_rollout_ref.rollout.enable_sleep_mode",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
        # handed whole to ray.init
        "ray_kwargs.ray_init.num_gpus",
    ],
)
def test_real_keys_pass(key):
    assert check_key(key) is None


def test_a_config_file_with_a_bad_key_is_flagged(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "# @package _global_\ndefaults:\n  - qwen25_math_7b\n  - _self_\n"
        "actor_rollout_ref:\n  actor:\n    grad_clip: 1.0\n    optim:\n      clip_grad: 1.0\n"
        "data:\n  max_respone_length: 8192\n"
    )
    assert keys_set_by(path) == [
        "actor_rollout_ref.actor.grad_clip", "actor_rollout_ref.actor.optim.clip_grad", "data.max_respone_length"
    ]
    assert [(f.key, f.kind) for f in check_file(path)] == [
        ("actor_rollout_ref.actor.grad_clip", "unread"), ("data.max_respone_length", "unknown")
    ]


def test_schema_is_verls_composed_ppo_trainer():
    schema = verl_schema()
    assert schema.actor_rollout_ref.actor.optim._target_ == "verl.workers.config.FSDPOptimizerConfig"
    assert "clip_grad" in schema.actor_rollout_ref.actor.optim
