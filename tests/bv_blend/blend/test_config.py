"""BVBlendConfig: defaults from the spec, validation that names the wrong value."""

import dataclasses

import pytest

from bv_blend import BVBlendConfig


def test_defaults_match_the_spec():
    config = BVBlendConfig()
    assert (config.gamma, config.epsilon, config.temperature) == (0.9, 1e-6, 0.1)
    assert (config.n0, config.v_prior, config.delta_n) == (1.0, 0.25, 1.0)
    assert (config.weight_mode, config.fixed_weight, config.max_abs_advantage) == ("sem", 0.5, "auto")
    assert config.variance_floor == "prior"
    assert config.sync_across_ranks is True


def test_is_a_frozen_dataclass_with_the_public_field_names():
    names = [field.name for field in dataclasses.fields(BVBlendConfig)]
    assert names[:9] == ["gamma", "epsilon", "temperature", "n0", "v_prior", "delta_n", "weight_mode",
                         "fixed_weight", "max_abs_advantage"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        BVBlendConfig().gamma = 0.5


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("gamma", 0.0, "gamma=0.0 is invalid"),
        ("gamma", 1.5, "in (0, 1]"),
        ("epsilon", -1e-6, "epsilon"),
        ("epsilon", 0.0, "must be > 0"),
        ("temperature", 0.0, "temperature=0.0"),
        ("n0", -1.0, "n0"),
        ("v_prior", -0.1, "v_prior"),
        ("delta_n", 0.0, "delta_n"),
        ("weight_mode", "entropy", "one of sem, fixed, neff, sigma"),
        ("fixed_weight", 1.5, "fixed_weight"),
        ("max_abs_advantage", 0.0, "max_abs_advantage"),
        ("max_abs_advantage", float("inf"), "max_abs_advantage"),
        ("max_abs_advantage", "AUTO", "must be 'auto', a finite number > 0, or None"),
        ("max_abs_advantage", True, "max_abs_advantage"),
        ("variance_floor", "floor", "one of prior, none"),
        ("variance_floor", None, "variance_floor"),
        ("gamma", float("nan"), "finite number"),
        ("temperature", "0.1", "finite number"),
        ("sync_across_ranks", "yes", "sync_across_ranks"),
    ],
)
def test_invalid_values_are_named(field, value, message):
    with pytest.raises(ValueError, match=r"algorithm\.bv_blend\.") as error:
        BVBlendConfig(**{field: value})
    assert message in str(error.value)
    assert field in str(error.value)


def test_from_mapping_accepts_known_keys_and_names_unknown_ones():
    assert BVBlendConfig.from_mapping({"temperature": 0.2}).temperature == 0.2
    assert BVBlendConfig.from_mapping(None) == BVBlendConfig()
    with pytest.raises(ValueError, match=r"Unknown option\(s\) algorithm\.bv_blend\.\{temprature\}"):
        BVBlendConfig.from_mapping({"temprature": 0.2})
