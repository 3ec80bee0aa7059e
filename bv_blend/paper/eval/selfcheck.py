"""The grader on a benchmark's own references: how often it agrees with the file's answers (CPU only).

Two checks per problem, each run through the same :func:`~bv_blend.paper.eval.suite.judge` as a model's response:

- ``answer``: the reference answer alone, as ``\\boxed{answer}``: it must parse into a maths object
  (Math-Verify's bare string fallback does not count: two unparsable strings "match" each other) and match
  itself. A failure means no response can be scored right on that problem by a maths comparison. For multiple
  choice, the gold letter after the option permutation.
- ``solution``: the file's reference solution, where it has one (MATH-500, Minerva-Math, OlympiadBench, some
  AIME releases). A failure means the grader reads a different final answer from a correct worked solution;
  e.g. Math-Verify 0.9 reads ``\boxed{2}, then ... \boxed{1.6}`` as the set {2, 1.6} (with a sentence break
  between the two boxes it reads the last one).

A failure record gives ``last_boxed``, the text of the last ``\boxed{}`` (what a reader would take as the
answer); Math-Verify's own reading can differ, which is what the check is there to show.

Run it on your copy of each benchmark before trusting a table: ``scripts/evaluate.py self-check``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from bv_blend.paper.eval.benchmarks import Benchmark, Problem
from bv_blend.paper.eval.suite import VerifyFn, _default_verify, build_request, judge

CHECKS = ("answer", "solution")
ParsesFn = Callable[[str], bool]


def _default_parses(answer: str) -> bool:
    from bv_blend.paper.rewards import answer_parses

    return answer_parses(answer)


@dataclass
class SelfCheckResult:
    """Per check: problems graded, how many the grader accepted, and the rejected ones."""

    benchmark: str
    num_problems: int
    graded: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)

    def accuracy(self, check: str) -> float | None:
        n = self.graded.get(check, 0)
        return self.accepted.get(check, 0) / n if n else None


def reference_responses(bench: Benchmark, problem: Problem, gold: str) -> dict[str, str]:
    """The responses that a perfect model would give, one per check this problem supports."""
    if bench.kind == "choice":
        return {"answer": f"The answer is \\boxed{{{gold}}}."}
    responses = {"answer": f"The final answer is $\\boxed{{{gold}}}$."}
    if problem.solution:
        responses["solution"] = problem.solution
    return responses


def self_check(
    bench: Benchmark,
    problems: Sequence[Problem],
    seed: int = 0,
    verify: VerifyFn = _default_verify,
    workers: int = 8,
    parses: ParsesFn = _default_parses,
) -> SelfCheckResult:
    """Grade every reference of ``problems`` with the evaluation's own judge."""

    def grade(job: tuple) -> tuple[str, bool]:
        _, request, check, response = job
        extracted, ok = judge(bench, request, response, verify)
        if ok and check == "answer" and bench.kind == "math":
            ok = parses(request.gold)
        return extracted, ok

    jobs = []
    for problem in problems:
        request = build_request(bench, problem, seed)
        for check, response in reference_responses(bench, problem, request.gold).items():
            jobs.append((problem, request, check, response))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        verdicts = list(
            tqdm(
                pool.map(grade, jobs),
                total=len(jobs),
                desc=f"self-check {bench.name}",
                disable=len(jobs) < 64,
            )
        )
    result = SelfCheckResult(bench.name, len(problems))
    for (problem, request, check, response), (extracted, ok) in zip(jobs, verdicts, strict=True):
        result.graded[check] = result.graded.get(check, 0) + 1
        result.accepted[check] = result.accepted.get(check, 0) + int(ok)
        if not ok:
            result.failures.append(
                {"benchmark": bench.name, "id": problem.id, "check": check, "gold": request.gold,
                 "last_boxed": extracted, "reference": response[-300:]}
            )
    return result


def self_check_table(results: Sequence[SelfCheckResult]) -> str:
    """A markdown table: per benchmark, each check's accepted / graded and percentage."""

    def cell(result: SelfCheckResult, check: str) -> str:
        accuracy = result.accuracy(check)
        if accuracy is None:
            return "-"
        return f"{result.accepted[check]}/{result.graded[check]} ({100 * accuracy:.1f}%)"

    lines = ["| benchmark | problems | answer round trip | reference solution |", "|:---|---:|---:|---:|"]
    lines += [f"| {r.benchmark} | {r.num_problems} | {cell(r, 'answer')} | {cell(r, 'solution')} |" for r in results]
    return "\n".join(lines) + "\n"
