"""configs/bv_blend.yaml composed with the installed verl's ppo_trainer.yaml, and verl's stock config + '+' keys."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException

from bv_blend import BVBlendConfig
from bv_blend.verl.glue.bv_blend import BVBlendOptions
from tests.bv_blend.verl._helpers import compose_config


def test_our_config_extends_verl_ppo_trainer_and_declares_every_option():
    config = compose_config()
    assert config.algorithm.adv_estimator == "bv_blend"
    assert config.actor_rollout_ref.rollout.n is not None and config.trainer.resume_mode == "auto"  # verl's keys
    glue = BVBlendOptions.from_algorithm(config.algorithm)
    estimator = glue.config
    assert estimator == BVBlendConfig() and glue == BVBlendOptions(config=estimator)  # yaml values == code defaults
    # from_algorithm fills a missing key with its default, so the key set is what shows a key left undeclared
    assert set(config.algorithm.bv_blend) == set(BVBlendOptions.defaults())


def test_overrides_need_no_plus():
    config = compose_config(
        [
            "algorithm.bv_blend.temperature=0.3",
            "algorithm.bv_blend.num_clusters=16",
            "algorithm.bv_blend.on_missing_cluster=error",
            "algorithm.bv_blend.weight_mode=fixed",
        ]
    )
    glue = BVBlendOptions.from_algorithm(config.algorithm)
    estimator = glue.config
    assert (estimator.temperature, estimator.weight_mode, glue.num_clusters) == (0.3, "fixed", 16)


def test_verl_stock_config_with_plus_keys_uses_code_defaults():
    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose(
            "ppo_trainer",
            overrides=[
                "algorithm.adv_estimator=bv_blend",
                "+algorithm.bv_blend.temperature=0.2",
                "+algorithm.bv_blend.num_clusters=8",
            ],
        )
        with pytest.raises(ConfigCompositionException):  # verl's struct config: a new key needs '+'
            compose("ppo_trainer", overrides=["algorithm.bv_blend.temperature=0.2"])
    glue = BVBlendOptions.from_algorithm(config.algorithm)
    estimator = glue.config
    assert estimator == BVBlendConfig(temperature=0.2) and glue == BVBlendOptions(config=estimator, num_clusters=8)


def test_unknown_option_is_a_clear_error_from_our_code():
    config = compose_config(["+algorithm.bv_blend.temprature=0.3"])
    with pytest.raises(ValueError, match=r"Unknown option\(s\) algorithm.bv_blend.\{temprature\}.*glue options"):
        BVBlendOptions.from_algorithm(config.algorithm)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("algorithm.bv_blend.on_missing_cluster=skip", "must be one of error, assign"),
        ("algorithm.bv_blend.on_missing_cluster=assign", "needs algorithm.bv_blend.codebook_path"),
        ("algorithm.bv_blend.num_clusters=0", "positive int"),
        ("algorithm.bv_blend.gamma=1.5", "gamma"),
    ],
)
def test_bad_values_are_clear_errors(override, match):
    with pytest.raises(ValueError, match=match):
        BVBlendOptions.from_algorithm(compose_config([override]).algorithm)
