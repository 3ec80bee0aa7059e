"""Run the evaluation: prompts from problems, samples from a generator, verdicts, one score per benchmark.

The generator is any ``GenerateFn``: :func:`bv_blend.eval.generate.vllm_generator` on a GPU, or canned
outputs in the tests. Everything around it (prompts, option permutation, extraction, Math-Verify, avg@k and
pass@1) is plain Python that runs anywhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from bv_blend.paper.eval.benchmarks import Benchmark, Problem
from bv_blend.paper.eval.extract import extract_boxed, extract_choice
from bv_blend.paper.eval.metrics import avg_at_k, mean_pass_at_k
from bv_blend.paper.eval.permute import option_letter, permute_options

# The training prompt's instruction (bv_blend/data/openr1.py), so evaluation asks what training taught.
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CHOICE_INSTRUCTION = (
    "Please reason step by step, and put the letter of the correct option (just the letter) within \\boxed{}."
)

Conversation = list[dict[str, str]]
# (conversations, samples per conversation) -> that many response texts per conversation
GenerateFn = Callable[[Sequence[Conversation], int], list[list[str]]]
VerifyFn = Callable[[str, str], bool]


@dataclass(frozen=True)
class Request:
    """What the model is asked for one problem, and what counts as right."""

    problem_id: str
    prompt: str
    gold: str  # reference answer (math) or the gold letter after permutation (choice)
    num_options: int = 0


def build_request(bench: Benchmark, problem: Problem, seed: int) -> Request:
    """The user turn for one problem; multiple-choice options are permuted by ``(seed, problem id)``."""
    if bench.kind == "math":
        return Request(problem.id, f"{problem.question} {MATH_INSTRUCTION}", problem.answer or "")
    key = f"{bench.name}/{problem.id}"
    options, gold, _ = permute_options(problem.options or (), problem.gold_index or 0, seed, key)
    listing = "\n".join(f"{option_letter(i)}. {text}" for i, text in enumerate(options))
    prompt = f"{problem.question}\n\n{listing}\n\n{CHOICE_INSTRUCTION}"
    return Request(problem.id, prompt, option_letter(gold), num_options=len(options))


def _default_verify(prediction: str, gold: str) -> bool:
    from bv_blend.paper.rewards import verify_answer

    return verify_answer(prediction, gold)


def judge(bench: Benchmark, request: Request, response: str, verify: VerifyFn = _default_verify) -> tuple[str, bool]:
    """(extracted answer, correct?) for one response. Maths: Math-Verify on the whole response (its last
    boxed answer); choice: the extracted letter equals the permuted gold letter."""
    if bench.kind == "math":
        return extract_boxed(response) or "", bool(verify(response, request.gold))
    letter = extract_choice(response, request.num_options)
    return letter or "", letter == request.gold


@dataclass
class BenchmarkResult:
    benchmark: str
    metric: str
    score: float
    num_problems: int
    samples: list[dict]


def score_benchmark(
    bench: Benchmark,
    requests: Sequence[Request],
    responses: Sequence[Sequence[str]],
    verify: VerifyFn = _default_verify,
    workers: int = 8,
) -> BenchmarkResult:
    """Judge every response and compute the benchmark's metric (avg@k or pass@1)."""
    if len(responses) != len(requests):
        raise ValueError(f"{bench.name}: {len(responses)} response lists for {len(requests)} problems.")
    jobs = [(r, j, text) for r, texts in zip(requests, responses, strict=True) for j, text in enumerate(texts)]
    # Math-Verify checks run in worker processes (bv_blend.rewards); threads keep them all busy.
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        verdicts = list(
            tqdm(
                pool.map(lambda job: judge(bench, job[0], job[2], verify), jobs),
                total=len(jobs),
                desc=f"score {bench.name}",
                disable=len(jobs) < 64,
            )
        )
    correct: dict[str, list[bool]] = {r.problem_id: [] for r in requests}
    samples = []
    for (request, j, text), (extracted, ok) in zip(jobs, verdicts, strict=True):
        correct[request.problem_id].append(ok)
        samples.append(
            {"id": request.problem_id, "sample": j, "gold": request.gold, "extracted": extracted, "correct": ok,
             "response": text}
        )
    rows = [correct[r.problem_id] for r in requests]
    score = avg_at_k(rows, bench.samples) if bench.samples > 1 else mean_pass_at_k(rows, k=1)
    return BenchmarkResult(bench.name, bench.metric, score, len(requests), samples)


def evaluate(
    benchmarks: Mapping[str, tuple[Benchmark, Sequence[Problem]]],
    generate: GenerateFn,
    seed: int = 0,
    verify: VerifyFn = _default_verify,
    out_dir: Path | None = None,
) -> dict[str, BenchmarkResult]:
    """Evaluate one model on several benchmarks; with ``out_dir``, write each one's samples as JSONL."""
    results = {}
    for name, (bench, problems) in benchmarks.items():
        requests = [build_request(bench, p, seed) for p in problems]
        conversations = [[{"role": "user", "content": r.prompt}] for r in requests]
        responses = generate(conversations, bench.samples)
        result = score_benchmark(bench, requests, responses, verify)
        results[name] = result
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            with open(out_dir / f"{name}.samples.jsonl", "w") as fh:
                for sample in result.samples:
                    fh.write(json.dumps(sample) + "\n")
    return results


def save_scores(path: Path, run: str, results: Mapping[str, BenchmarkResult], settings: Mapping) -> None:
    """One run's scores as JSON, read back by :func:`load_scores` to build the table."""
    payload = {
        "run": run,
        "settings": dict(settings),
        "scores": {name: {k: v for k, v in asdict(r).items() if k != "samples"} for name, r in results.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))


def load_scores(path: Path) -> tuple[str, dict[str, float]]:
    """(run name, {benchmark: score}) from a file written by :func:`save_scores`."""
    payload = json.loads(Path(path).read_text())
    return payload["run"], {name: entry["score"] for name, entry in payload["scores"].items()}


def to_verl_rows(bench: Benchmark, problems: Sequence[Problem]) -> list[dict]:
    """A maths benchmark as verl dataset rows (the same prompt as :func:`build_request`), for the trainer's
    validation set (``data.val_files``); verl scores them with the training reward (Math-Verify)."""
    if bench.kind != "math":
        raise ValueError(f"{bench.name} is multiple choice; the trainer's Math-Verify reward scores maths only.")
    rows = []
    for index, problem in enumerate(problems):
        request = build_request(bench, problem, seed=0)
        rows.append(
            {
                "data_source": f"bv_blend_eval/{bench.name}",
                "prompt": [{"role": "user", "content": request.prompt}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": request.gold},
                "extra_info": {"split": "test", "index": index, "id": problem.id},
            }
        )
    return rows
