"""The demo's reward function is verl's own GSM8K rule scorer, reached through a per-family data_source."""

from __future__ import annotations

import pytest

from instruments.run import reward
from instruments.run.task import FAMILIES


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_scores_like_verl_gsm8k_strict(family):
    assert reward.compute_score(family, "#### 42", "42") == 1.0
    assert reward.compute_score(family, "#### 41", "42") == 0.0
    assert reward.compute_score(family, "42", "42") == 0.0  # a bare answer lacks the verifier's format
    assert reward.compute_score(family, "#### 4 then #### 42", "42", extra_info={"num_turns": 2}) == 1.0


def test_unknown_data_source_is_a_clear_error():
    with pytest.raises(ValueError, match="'openai/gsm8k' is not a family of the demo's task"):
        reward.compute_score("openai/gsm8k", "#### 1", "1")


def test_verl_loads_it_by_the_configured_path():
    from verl.utils.import_utils import load_extern_object

    fn = load_extern_object(module_path=reward.PATH, object_name=reward.NAME)
    assert fn is reward.compute_score
