"""A run folder as verl writes it (metrics JSONL, validation and rollout dumps), with numbers chosen by hand; with
``own_start=False``, as the demo's second run leaves it (no validation before training: it shares the first's)."""

from __future__ import annotations

import json
from pathlib import Path

# "1 plus 2 equals what?" is a substring of "11 plus 2 equals what?": a prompt must match the longest question
QUESTION_FAMILY = {
    "Repeat the number 5.": "echo",
    "Write down 15.": "echo",
    "1 plus 2 equals what?": "tiny_sum",
    "11 plus 2 equals what?": "small_sum",
}
# validation scores: step -> question -> scores of its 2 samples
VALIDATION = {
    0: {"Repeat the number 5.": [1, 0], "Write down 15.": [0, 0], "1 plus 2 equals what?": [1, 1],
        "11 plus 2 equals what?": [0, 0]},
    2: {"Repeat the number 5.": [1, 1], "Write down 15.": [1, 0], "1 plus 2 equals what?": [1, 1],
        "11 plus 2 equals what?": [0, 0]},
    4: {"Repeat the number 5.": [1, 1], "Write down 15.": [1, 1], "1 plus 2 equals what?": [1, 1],
        "11 plus 2 equals what?": [1, 0]},
}
# bv_blend's last validation where it differs from grpo's (the method difference is then not 0)
BV_BLEND_LAST = {"Repeat the number 5.": [1, 0], "Write down 15.": [0, 0], "1 plus 2 equals what?": [1, 1],
                 "11 plus 2 equals what?": [1, 1]}
# training groups per step: (prompt, scores); step 1 draws one prompt twice (two uids, so two groups)
ROLLOUTS = {
    1: [("Add 1 and 1.", [1, 1]), ("Add 1 and 1.", [0, 0]), ("Add 2 and 5.", [1, 0])],
    2: [("Add 1 and 1.", [1, 0]), ("Add 2 and 5.", [0, 0]), ("Add 3 and 3.", [1, 1])],
}
STEP_TIME = {1: 30.0, 2: 4.0, 3: 5.0, 4: 6.0}
ADV_TIME = {1: 0.3, 2: 0.2, 3: 0.1, 4: 0.3}
BV_SIGNAL = {1: 0.5, 2: 1.0, 3: 1.0, 4: 1.0}


def _prompt(question: str) -> str:
    return f"user\n{question}\nassistant\n"  # verl decodes the ChatML prompt without its special tokens


def family_means(step: int, validation: dict | None = None) -> dict[str, float]:
    scores: dict[str, list[float]] = {}
    for question, values in (validation or VALIDATION)[step].items():
        scores.setdefault(QUESTION_FAMILY[question], []).extend(values)
    return {family: sum(v) / len(v) for family, v in scores.items()}


def validation_of(method: str, own_start: bool = True) -> dict[int, dict[str, list[int]]]:
    """The validations a fake run of ``method`` holds: step -> question -> scores."""
    validation = {step: dict(v) for step, v in VALIDATION.items() if own_start or step > 0}
    if method == "bv_blend":
        validation[4] = dict(BV_BLEND_LAST)
    return validation


def _write_validation(folder: Path, validation: dict[int, dict[str, list[int]]]) -> None:
    (folder / "validation").mkdir(parents=True)
    for step, per_question in validation.items():
        rows = [{"input": _prompt(q), "output": "#### 3" if s else "3", "gts": "3", "score": float(s), "step": step,
                 "acc": float(s), "uid": f"u{step}-{i}_{j}_0"}
                for i, (q, scores) in enumerate(per_question.items()) for j, s in enumerate(scores)]
        (folder / "validation" / f"{step}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def _val_metrics(validation: dict[int, dict[str, list[int]]], step: int) -> dict[str, float]:
    samples = len(next(iter(validation[step].values())))
    means = family_means(step, validation)
    return ({f"val-core/{f}/acc/mean@{samples}": v for f, v in means.items()}
            | {f"val-aux/{f}/acc/std@{samples}": 0.1 for f in means})  # not a pass rate: ignored


def write_fake_run(folder: Path, method: str = "grpo", own_start: bool = True,
                   rollouts: dict[int, list[tuple[str, list[int]]]] | None = None,
                   extra_metrics: dict[int, dict[str, float]] | None = None) -> Path:
    """A method run; ``own_start=False``: without its step-0 validation (``trainer.val_before_train=false``).
    ``rollouts`` replaces :data:`ROLLOUTS`; ``extra_metrics`` (step -> metrics) joins the steps' logged metrics."""
    validation = validation_of(method, own_start)
    _write_validation(folder, validation)
    (folder / "rollouts").mkdir()
    lines = []
    for step in range(0 if own_start else 1, 5):
        data: dict[str, float] = _val_metrics(validation, step) if step in validation else {}
        if step >= 1:
            data |= {"timing_s/step": STEP_TIME[step], "timing_s/adv": ADV_TIME[step], "critic/score/mean": 0.5}
            if method == "bv_blend":
                data |= {"bv_blend/effective_signal_ratio": BV_SIGNAL[step], "bv_blend/grpo_signal_ratio": 0.25}
        data |= (extra_metrics or {}).get(step, {})
        lines.append(json.dumps({"step": step, "data": data}))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for step, groups in (ROLLOUTS if rollouts is None else rollouts).items():
        rows = [{"input": _prompt(q), "output": "#### 2", "gts": "2", "score": float(s), "step": step,
                 "uid": f"uid{step}-{g}_{j}_0"}
                for g, (q, scores) in enumerate(groups) for j, s in enumerate(scores)]
        (folder / "rollouts" / f"{step}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder
