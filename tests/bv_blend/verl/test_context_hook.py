"""The context check in verl's real trainer constructors, before any worker starts (bv_blend/verl/hooks.py).

The constructors are verl 0.9.1's own, patched by bv_blend's plugin; they are given nothing but the config, so
any check that does not fire first ends in an unrelated error from verl's ``__init__`` (no workers exist here).
"""

from __future__ import annotations

import json

import pytest
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.v1 import trainer_sync

from bv_blend.verl.context_budget import ContextBudgetError
from tests.bv_blend.verl._helpers import compose_config


@pytest.mark.parametrize("trainer_cls", ["v1", "legacy"])
def test_trainer_start_refuses_a_budget_over_the_models_context(tmp_path, trainer_cls):
    model = tmp_path / "Qwen2.5-Math-7B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    config = compose_config([
        "algorithm.bv_blend.num_clusters=3", "data.max_prompt_length=1024", "data.max_response_length=8192",
        f"actor_rollout_ref.model.path={model}",
    ])
    cls = trainer_sync.PPOTrainerSync if trainer_cls == "v1" else ray_trainer.RayPPOTrainer
    with pytest.raises(ContextBudgetError, match="= 9216 tokens exceed the 4096-token window"):
        cls(config, *([] if trainer_cls == "v1" else [None, None, None]))
