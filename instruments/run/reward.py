"""The demo's reward functions for verl, for rows whose data_source is a task family: verl's own GSM8K rule scorer
(the tiny model, which learnt the ``#### N`` format in its warm-up), and the last number of the response (a
pretrained instruct model, told "Answer with the number only.", answers in its own words: "The answer is 12.").

Each family is its own data_source, so that verl's validation loop reports the pass rate per family
(``val-core/<family>/acc/mean@<n>``) with no code of ours. verl's default scorer dispatches on data_source and
knows only its own sources, so the demo names this function in verl's config:

    reward.custom_reward_function.path=pkg://instruments.run.reward
    reward.custom_reward_function.name=compute_score

verl's reward loop imports the module by name in its reward worker and calls the function once per response
(verl/experimental/reward_loop/reward_manager/naive.py); a float result is logged as the response's ``acc``.
"""

from __future__ import annotations

import re
from typing import Any

from instruments.cpu.launch import verl_rule_score
from instruments.run.task import GSM8K_SOURCE, TASKS

PATH = "pkg://instruments.run.reward"
NAME = "compute_score"
LAST_NUMBER_NAME = "compute_last_number_score"
# an integer, signed, with thousands separators allowed ("1,024"); a decimal's integer part is not taken for it
NUMBER = re.compile(r"(?<![\d.])-?\d{1,3}(?:,\d{3})+(?![\d,])|(?<![\d.])-?\d+(?:\.\d+)?")
ANSWER_MARK = "####"  # the verifier accepts "#### <answer>" only (verl/utils/reward_score/gsm8k.py, strict)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                  **_: Any) -> float:
    """1.0 iff ``solution_str`` contains ``#### <ground_truth>``, exactly as verl scores GSM8K."""
    _check_source(data_source)
    return verl_rule_score(GSM8K_SOURCE, solution_str, ground_truth)


def _check_source(data_source: str) -> None:
    if not any(data_source in families for families in TASKS.values()):
        names = sorted(name for families in TASKS.values() for name in families)
        raise ValueError(f"data_source {data_source!r} is not a family of the demo's tasks ({names}); "
                         "this reward function only scores parquet files written by instruments.run.task.write_task")


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (thousands separators removed), or None."""
    found = NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def compute_last_number_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                              **_: Any) -> float:
    """1.0 iff the last number of ``solution_str`` is exactly ``ground_truth`` (an integer): a verifier that reads a
    pretrained model's natural answers. Nothing else counts: "12.0" is not "12", and an answer followed by another
    number (a rambling response) is read at its last one."""
    _check_source(data_source)
    return float(last_number(solution_str) == str(ground_truth).strip())


def in_answer_format(response: str) -> bool:
    """Whether a response carries the answer marker the verifier requires (right answer or not)."""
    return ANSWER_MARK in response


def is_bare_number(response: str) -> bool:
    """Whether a response is a number and nothing else: what a pretrained model is told to write ("Answer with the
    number only."), its answer format in the demo's tables."""
    return bool(re.fullmatch(r"\s*-?[\d,]+(?:\.\d+)?\.?\s*", response))


def verl_overrides(last_number_answers: bool = False) -> list[str]:
    """The hydra overrides that make verl score the demo's rows with :func:`compute_score`, or with
    :func:`compute_last_number_score` for a pretrained model's natural answers."""
    name = LAST_NUMBER_NAME if last_number_answers else NAME
    return [f"reward.custom_reward_function.path={PATH}", f"reward.custom_reward_function.name={name}"]
