"""Offline priors for the cold start (history_spec 4): a file of each training prompt's scores under the initial policy.

The file is JSON, ``{prompt key: [score, ...]}``, one list of scores in [0, 1] per prompt (N samples each; SPO's
recipe uses N = 8). ``bv-blend priors`` writes it from verl's own validation-only generation over the
training prompts. SPO takes it as its prior (``algorithm.spo.offline_values``), BV-Blend as the start of its prompt
and cluster moments (``algorithm.bv_blend.prior_file``). A malformed file is a clear error before any worker starts.

The conversion of verl's dump (``trainer.validation_data_dir``, one JSON line per sampled response) lives here too,
verl-free: :func:`read_generation_dump` reads it, :func:`scores_from_dump` keys each sample by the training row whose
prompt verl rendered into exactly the sample's ``input`` (``bv_blend.verl.offline_priors`` renders them, with verl's
own code), and :func:`summarize_priors` describes the result. docs/priors.md says how to run it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bv_blend.core.jsonl import jsonl_lines


def load_priors(path: str | Path, option: str) -> dict[str, np.ndarray]:
    """The prior file at ``path``: prompt key -> float64 scores; ``option`` names the setting in errors.

    Raises:
        ValueError: the file is missing, not JSON, not a mapping of keys to non-empty lists of numbers in [0, 1].
    """
    path = Path(path).expanduser()  # a hydra override reaches us with its ~ unexpanded
    if not path.is_file():
        raise ValueError(f"{option}={path} does not exist. Write it with `bv-blend priors`, or unset {option}.")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{option}={path} is not a JSON file of prompt scores ({error}).") from error
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{option}={path} must be a non-empty JSON object {{prompt key: [score, ...]}}.")
    priors = {}
    for key, scores in data.items():
        if not isinstance(scores, list) or not scores or not all(_is_score(s) for s in scores):
            raise ValueError(
                f"{option}={path}: prompt {key!r} holds {scores!r:.80}; each prompt needs a non-empty list of scores "
                "in [0, 1] (0/1 from a verifier)."
            )
        priors[key] = np.asarray(scores, dtype=np.float64)
    return priors


def priors_hash(priors: Mapping[str, np.ndarray]) -> str:
    """A content hash of a prior file's values, saved with a state so that a resume uses the same priors."""
    digest = hashlib.blake2b(digest_size=16)
    for key in sorted(priors):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(priors[key], dtype=np.float64).tobytes())
    return digest.hexdigest()


def unmatched(priors: Mapping[str, np.ndarray], training_keys: Iterable[str]) -> int:
    """How many of the file's prompts no training row has (counted and reported, not an error)."""
    return len(set(priors) - set(training_keys))


def write_priors(path: str | Path, scores: Mapping[str, list[float]]) -> None:
    """Write a prior file (atomically: a half-written file is never left under the final name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({key: [float(s) for s in values] for key, values in scores.items()}, sort_keys=True))
    tmp.replace(path)


def _is_score(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= 1


# --- verl's validation dump -> a prior file -------------------------------------------------------------------------


@dataclass(frozen=True)
class DumpedSample:
    """One sampled response in verl's validation dump: one agent-loop session, whatever its number of outputs.

    Attributes:
        line: the dump's line (1-based) of the session's first output, for error messages.
        session: ``{uid}_{session_id}`` from the dump's ``uid`` (V1 trainer); ``line<N>`` when it has none (legacy).
        prompt: the session's first ``input``: verl's ``tokenizer.decode(prompt_ids, skip_special_tokens=True)``.
        score: the ``score`` verl's reward function gave the session (its final output's, as verl's metrics use).
        ground_truth: the dumped ``gts`` (the row's ``reward_model.ground_truth``), ``None`` if absent.
    """

    line: int
    session: str
    prompt: str
    score: float
    ground_truth: Any = None


@dataclass(frozen=True)
class TrainingPrompt:
    """One training row as verl's dump would show it: its prompt key, its rendered prompt, its ground truth."""

    key: str
    rendered: str
    ground_truth: Any = None


class UnmatchedSamplesError(ValueError):
    """Dumped samples whose prompt is no training row's rendered prompt: the dump cannot be keyed exactly."""


def read_generation_dump(path: str | Path) -> list[DumpedSample]:
    """The sessions of one verl validation dump (``<validation_data_dir>/<step>.jsonl``), in file order.

    verl's V1 trainer writes every output of a multi-output agent loop, keyed ``{uid}_{session_id}_{index}``, each
    with its session's final score; one session is one sample of the prompt, so its outputs count once, with the
    first output's input (the prompt as sent) and the last one's score.

    Raises:
        ValueError: the file is missing or empty, a line is not JSON, or lacks ``input`` / ``score``.
    """
    path = Path(path)
    try:
        lines = jsonl_lines(path)
    except OSError as error:
        raise ValueError(f"Cannot read verl's validation dump {path}: {error}.") from error
    sessions: dict[str, tuple[int, int, DumpedSample, Any]] = {}  # session -> (first index, last index, sample, score)
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            entry = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number} is not a JSON line ({error}); is it verl's validation dump?") from error
        if not isinstance(entry, dict) or "input" not in entry or "score" not in entry:
            raise ValueError(f"{path}:{number} has no 'input' and 'score': not a line of verl's validation dump.")
        session, index = _session_of(entry.get("uid"), number)
        sample = DumpedSample(number, session, str(entry["input"]), entry["score"], entry.get("gts"))
        if session not in sessions:
            sessions[session] = (index, index, sample, entry["score"])
            continue
        first, last, kept, score = sessions[session]
        if index < first:
            first, kept = index, sample
        if index >= last:
            last, score = index, entry["score"]
        sessions[session] = (first, last, kept, score)
    if not sessions:
        raise ValueError(f"verl's validation dump {path} holds no sample.")
    return [_with_score(kept, score) for _, _, kept, score in sessions.values()]


def _session_of(uid: Any, line: int) -> tuple[str, int]:
    """``({uid}_{session_id}, index)`` of a dumped key ``{uid}_{session_id}_{index}`` (verl's replay-buffer keys)."""
    if not isinstance(uid, str):
        return f"line{line}", 0
    parts = uid.rsplit("_", 2)
    if len(parts) == 3 and parts[2].isdigit():
        return f"{parts[0]}_{parts[1]}", int(parts[2])
    return uid, 0


def _with_score(sample: DumpedSample, score: Any) -> DumpedSample:
    return DumpedSample(sample.line, sample.session, sample.prompt, score, sample.ground_truth)


def scores_from_dump(
    samples: Sequence[DumpedSample], prompts: Sequence[TrainingPrompt], source: str = "the dump"
) -> dict[str, list[float]]:
    """Prompt key -> the scores of its samples, each sample keyed by the training row verl rendered it from.

    A sample belongs to the rows whose rendered prompt equals its ``prompt`` exactly. When several rows with
    different keys render the same prompt, the dumped ground truth narrows them; rows that still tie (same prompt,
    same ground truth) cannot be told apart by the policy or the verifier, so each of their keys gets the pooled
    scores of all their samples. Rows with one key (duplicate rows, or rows whose last user message is the same)
    simply pool their samples under it.

    Raises:
        UnmatchedSamplesError: samples whose prompt no row renders, or whose ground truth no such row has; the
            message counts them and shows the first few (line, prompt), and says what usually causes it.
        ValueError: a score that is not a number in [0, 1] (the priors are Beta / moment priors of a verifier's
            0/1 outcome), naming its line.
    """
    by_prompt: dict[str, dict[str, list[Any]]] = {}  # rendered prompt -> key -> its rows' ground truths
    for prompt in prompts:
        by_prompt.setdefault(prompt.rendered, {}).setdefault(prompt.key, []).append(_plain(prompt.ground_truth))
    scores: dict[str, list[float]] = {}
    unmatched: list[tuple[DumpedSample, str]] = []
    for sample in samples:
        if not _is_score(sample.score):
            raise ValueError(
                f"{source}, line {sample.line}: score {sample.score!r} is not a number in [0, 1]. The priors are the "
                "initial policy's success rates (SPO's Beta prior, BV-Blend's moments): the run's reward function must "
                "score each response in [0, 1] (0/1 from a verifier)."
            )
        keys = by_prompt.get(sample.prompt)
        if keys is None:
            unmatched.append((sample, "no training row renders this prompt"))
            continue
        narrowed = list(keys)
        if sample.ground_truth is not None:  # a row without a ground truth cannot be told apart by it
            truth = _plain(sample.ground_truth)
            narrowed = [key for key, truths in keys.items() if truth in truths or None in truths]
        if not narrowed:
            unmatched.append((sample, f"its rows have another ground truth than {sample.ground_truth!r:.40}"))
            continue
        for key in narrowed:
            scores.setdefault(key, []).append(float(sample.score))
    if unmatched:
        first = list({s.prompt: (s, why) for s, why in unmatched[::-1]}.values())  # each prompt's first sample
        first = sorted(first, key=lambda item: item[0].line)[:3]
        shown = "; ".join(f"line {s.line} ({why}): {s.prompt!r:.160}" for s, why in first)
        raise UnmatchedSamplesError(
            f"{len(unmatched)} of the {len(samples)} samples in {source} match no training row, e.g. {shown}. Each "
            "sample's input must equal a training row's prompt as verl renders it (the tokenizer's chat template with "
            "the generation prompt, left-truncated to rollout.prompt_length, decoded without special tokens). Was the "
            "dump made with these training files, this tokenizer and data.apply_chat_template_kwargs?"
        )
    return scores


def _plain(value: Any) -> Any:
    """A ground truth as JSON would give it back (numpy arrays and scalars to lists and numbers), for comparison."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class PriorsSummary:
    """What a prior file holds, in the numbers the script prints."""

    prompts: int
    samples: int
    min_samples: int
    max_samples: int
    mean_score: float
    all_right: float  # share of prompts whose every score is 1
    all_wrong: float  # share of prompts whose every score is 0
    training_prompts: int | None = None  # distinct prompt keys of the training files, when known
    without_samples: int | None = None  # of those, how many got no sample (absent from the file)

    def lines(self) -> list[str]:
        per_prompt = str(self.min_samples) if self.min_samples == self.max_samples else (
            f"{self.min_samples}-{self.max_samples}")
        lines = [
            f"prompts: {self.prompts} x {per_prompt} samples ({self.samples} scored responses)",
            f"mean score: {self.mean_score:.4f}",
            f"all-right prompts: {self.all_right:.1%}   all-wrong prompts: {self.all_wrong:.1%}",
        ]
        if self.training_prompts is not None:
            lines.append(f"training prompts (distinct keys): {self.training_prompts}, without samples: "
                         f"{self.without_samples}")
        return lines


def summarize_priors(
    scores: Mapping[str, Sequence[float]], training_keys: Iterable[str] | None = None
) -> PriorsSummary:
    """Counts, mean score and the shares of prompts all right / all wrong; with ``training_keys``, how many of the
    training prompts have no sample.

    Raises:
        ValueError: ``scores`` is empty or holds a prompt without scores.
    """
    if not scores or any(len(values) == 0 for values in scores.values()):
        raise ValueError("A prior file needs at least one prompt, each with at least one score.")
    counts = [len(values) for values in scores.values()]
    flat = np.concatenate([np.asarray(values, dtype=np.float64) for values in scores.values()])
    right = sum(all(s == 1 for s in values) for values in scores.values())
    wrong = sum(all(s == 0 for s in values) for values in scores.values())
    keys = set(training_keys) if training_keys is not None else None
    return PriorsSummary(
        prompts=len(scores),
        samples=int(flat.size),
        min_samples=min(counts),
        max_samples=max(counts),
        mean_score=float(flat.mean()),
        all_right=right / len(scores),
        all_wrong=wrong / len(scores),
        training_prompts=None if keys is None else len(keys),
        without_samples=None if keys is None else len(keys - set(scores)),
    )


def priors_from_dump(dump: str | Path, prompts: Sequence[TrainingPrompt], out: str | Path) -> PriorsSummary:
    """Convert verl's validation dump into the prior file ``out`` (atomically), read it back as the estimators will,
    and describe it.

    Raises:
        UnmatchedSamplesError, ValueError: as :func:`read_generation_dump` and :func:`scores_from_dump`.
    """
    scores = scores_from_dump(read_generation_dump(dump), prompts, source=str(dump))
    write_priors(out, scores)
    written = load_priors(out, "--out")  # what SPO and BV-Blend will read: the same checks, before any run uses it
    return summarize_priors({key: values.tolist() for key, values in written.items()}, (p.key for p in prompts))


__all__ = [
    "DumpedSample",
    "PriorsSummary",
    "TrainingPrompt",
    "UnmatchedSamplesError",
    "load_priors",
    "priors_from_dump",
    "priors_hash",
    "read_generation_dump",
    "scores_from_dump",
    "summarize_priors",
    "unmatched",
    "write_priors",
]
