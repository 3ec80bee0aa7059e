"""The demo's reward function for verl: verl's own GSM8K rule scorer, for rows whose data_source is a task family.

Each family is its own data_source, so that verl's validation loop reports the pass rate per family
(``val-core/<family>/acc/mean@<n>``) with no code of ours. verl's default scorer dispatches on data_source and
knows only its own sources, so the demo names this function in verl's config:

    reward.custom_reward_function.path=pkg://instruments.demo.reward
    reward.custom_reward_function.name=compute_score

verl's reward loop imports the module by name in its reward worker and calls the function once per response
(verl/experimental/reward_loop/reward_manager/naive.py); a float result is logged as the response's ``acc``.
"""

from __future__ import annotations

from typing import Any

from instruments.cpu.launch import verl_rule_score
from instruments.demo.task import GSM8K_SOURCE, TASKS

PATH = "pkg://instruments.demo.reward"
NAME = "compute_score"
ANSWER_MARK = "####"  # the verifier accepts "#### <answer>" only (verl/utils/reward_score/gsm8k.py, strict)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                  **_: Any) -> float:
    """1.0 iff ``solution_str`` contains ``#### <ground_truth>``, exactly as verl scores GSM8K."""
    if not any(data_source in families for families in TASKS.values()):
        names = sorted(name for families in TASKS.values() for name in families)
        raise ValueError(f"data_source {data_source!r} is not a family of the demo's tasks ({names}); "
                         "this reward function only scores parquet files written by instruments.demo.task.write_task")
    return verl_rule_score(GSM8K_SOURCE, solution_str, ground_truth)


def in_answer_format(response: str) -> bool:
    """Whether a response carries the answer marker the verifier requires (right answer or not)."""
    return ANSWER_MARK in response


def verl_overrides() -> list[str]:
    """The hydra overrides that make verl score the demo's rows with :func:`compute_score`."""
    return [f"reward.custom_reward_function.path={PATH}", f"reward.custom_reward_function.name={NAME}"]
