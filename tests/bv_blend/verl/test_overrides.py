"""Hydra overrides written from Python values read back, through hydra's own override parser, as those values."""

from __future__ import annotations

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from bv_blend.verl.overrides import config_overrides, dotted_leaves, override_value

ROUND_TRIP = [
    "plain", "a.b-c+d/e_f", "/tmp/run out/checkpoints", "~/data", "it's", "a\\b", "a\\'b", "C:\\dir\\", "",
    "1.0", "true", "NULL", "nan", "x:y", "a,b", "a=b", "[x]", '"q"', "-x", "${a}",
    3, -2, 1e-6, 0.5, float("inf"), True, False, None, [1, "a b"], {"k": "v w", "n": 1}, [],
]  # fmt: skip


@pytest.mark.parametrize("value", ROUND_TRIP, ids=repr)
def test_value_reads_back_unchanged(value):
    parsed = OverridesParser.create().parse_override(f"key={override_value(value)}").value()
    assert parsed == value and type(parsed) is type(value)


def test_strings_that_need_no_quotes_stay_bare():
    assert override_value("/data/train.parquet") == "/data/train.parquet"
    assert override_value("Qwen/Qwen2.5-Math-7B") == "Qwen/Qwen2.5-Math-7B"
    assert override_value("1.0") == "'1.0'" and override_value("true") == "'true'"


def test_a_config_becomes_add_or_replace_overrides():
    node = OmegaConf.create({"a": {"b": [1, "x y"], "c": None, "d": {"e": True}}, "f": 1e-4})
    assert dotted_leaves(node) == {"a.b": [1, "x y"], "a.c": None, "a.d.e": True, "f": 1e-4}
    assert config_overrides(node) == ["++a.b=[1,'x y']", "++a.c=null", "++a.d.e=true", "++f=0.0001"]
