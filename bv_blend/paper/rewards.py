"""The paper's binary Math-Verify reward: 1.0 if the final answer verifies against the ground truth, else 0.0.

Use it from verl with::

    reward.custom_reward_function.path=pkg://bv_blend.paper.rewards
    reward.custom_reward_function.name=compute_score

(a file path to this module works too).

Why worker processes: math-verify's own timeout uses ``signal.alarm``, which only works in a
process's main thread, but verl's reward loop calls ``compute_score`` from executor threads. A
sympy simplification of an answer like ``9^{9^{9^{9}}}`` can run for minutes and never yields to a
thread timeout. So every check runs in a small pool of spawned worker processes (where
math-verify's signal timeouts work again as a first line of defence), and a worker that passes
the deadline is killed and replaced, so one pathological answer costs ``timeout_s`` and never hangs
or starves the pool.

Verifier failures are counted, not hidden: math-verify turns its own errors (a LaTeX or sympy failure on an
answer) and its timeouts into "not verified" and logs them; each worker counts those log records, and a check past
the hard deadline counts too. ``compute_score`` returns ``{"score", "acc", "verifier_failure"}``: verl's reward
loop carries the extra keys in ``reward_extra_info`` (validation aggregates them into ``val-aux/<source>/
verifier_failure/mean@N``; the training batch holds them, and the plugin's metrics hook sums them into
``reward/verifier_failures``). An exception that does not come from math-verify (our own code's TypeError,
AttributeError, NameError ...) is a programming error: it is raised in the caller, never scored 0.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import queue
import select
import subprocess
import sys
import threading
import traceback
from typing import Any, NamedTuple

DEFAULT_TIMEOUT_S = 5.0
# The reward_extra_info key of a verifier failure (the trainer hooks sum it into a step metric).
FAILURE_KEY = "verifier_failure"
_STARTUP_TIMEOUT_S = 120.0  # importing math-verify + sympy in a fresh process; not part of a check's budget


def _gold_text(ground_truth: str) -> str:
    """Ground truths are bare answers ("1/2", "\\frac{1}{2}", "(0, 1]"); math-verify's LaTeX parser
    only reads delimited maths, so a bare one is wrapped in \\boxed{} (as verl's math_verify does)."""
    gt = ground_truth.strip()
    return gt if ("\\boxed" in gt or "$" in gt) else f"\\boxed{{{gt}}}"


def _check_in_worker(prediction: str, ground_truth: str, step_timeout: int) -> bool:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    gold = parse(_gold_text(ground_truth), extraction_config=configs, parsing_timeout=step_timeout)
    if not gold:
        return False
    pred = parse(prediction, extraction_config=configs, parsing_timeout=step_timeout)
    if not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=step_timeout))


def _parses_in_worker(answer: str, step_timeout: int) -> bool:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    # no_fallback: a bare string match (what math-verify returns when it understood nothing) is not a parse.
    return bool(parse(_gold_text(answer), configs, fallback_mode="no_fallback", parsing_timeout=step_timeout))


_OPERATIONS = {"verify": _check_in_worker, "parses": _parses_in_worker}
# What math-verify logs where it swallows a failure of its own (parser.py, grader.py): an exception (logged with
# exc_info) or its signal timeout ("Timeout during parsing/comparison").
_TIMEOUT_LOG = "Timeout during"


class VerifierCrash(RuntimeError):
    """A worker's operation raised an exception that math-verify did not handle: a programming error (ours, or an
    API change), raised in the caller instead of scoring the answer 0."""


class Verdict(NamedTuple):
    """One check: whether the answer verified (or parsed), and whether math-verify failed on it (an error it
    swallowed, or a timeout), which also reads as not verified. (A NamedTuple, not a dataclass: verl loads this
    file by path under another module name, which dataclasses cannot resolve.)"""

    ok: bool
    failure: bool = False


def _answer(request: list, failures: list) -> dict[str, Any]:
    """The worker's reply to one request. math-verify's own failures (counted by the log handler into ``failures``,
    or its timeout escaping) are verdicts; any other exception is a programming error, sent back with its traceback."""
    from math_verify.errors import TimeoutException

    failures.clear()
    operation, *args = request
    try:
        result = bool(_OPERATIONS[operation](*args))
    except TimeoutException:  # math-verify's alarm, outside its own handlers
        return {"ok": False, "failure": True}
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error), "traceback": traceback.format_exc()}
    return {"ok": result, "failure": bool(failures)}


def _worker_main() -> None:
    """Worker loop on stdin/stdout: one JSON request per line, one JSON reply per line back."""
    import logging

    failures: list[logging.LogRecord] = []

    class _CountFailures(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info or str(record.msg).startswith(_TIMEOUT_LOG):
                failures.append(record)

    # math-verify logs a swallowed error at debug (with the exception) and a timeout at warning: counted here,
    # kept out of the worker's output (the reward's metric reports them).
    verifier_log = logging.getLogger("math_verify")
    verifier_log.setLevel(logging.DEBUG)
    verifier_log.propagate = False
    verifier_log.addHandler(_CountFailures())
    import math_verify  # noqa: F401  (import before signalling ready, so it does not count against a check)

    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        out.write(json.dumps(_answer(json.loads(line), failures)) + "\n")
        out.flush()


class _Worker:
    """One math-verify process. A plain ``python -c`` child, not multiprocessing: spawn would re-import
    the caller's ``__main__`` (a hazard for scripts without a main guard), and fork would copy a
    threaded parent mid-lock."""

    def __init__(self) -> None:
        import importlib.util

        if importlib.util.find_spec("math_verify") is None:
            raise ImportError("the Math-Verify reward needs math-verify, which is not installed in this Python: "
                              "pip install '.[paper]' in the bv_blend clone (or pip install 'math-verify>=0.7')")
        code = "from bv_blend.paper.rewards import _worker_main; _worker_main()"
        self.process = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        if self._readline(_STARTUP_TIMEOUT_S) != "ready":
            self.kill()
            raise RuntimeError("math-verify worker process failed to start (is bv_blend importable?)")

    def _readline(self, timeout_s: float) -> str | None:
        """The next line from the worker, or None on timeout or if it died."""
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = self.process.stdout.readline()
        return line.strip() if line else None

    def ask(self, request: list, timeout_s: float) -> dict[str, Any] | None:
        """The worker's reply to ``[operation, *args]``, or None if it did not answer within ``timeout_s``."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        answer = self._readline(timeout_s)
        return None if answer is None else json.loads(answer)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=5)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class VerifierPool:
    """Up to ``max_workers`` math-verify processes shared by all threads of this process."""

    def __init__(self, max_workers: int | None = None) -> None:
        default = int(os.environ.get("BV_BLEND_REWARD_WORKERS", min(4, os.cpu_count() or 1)))
        self.max_workers = max(1, max_workers or default)
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._lock = threading.Lock()
        self._started = 0
        self.killed = 0  # workers killed on a timeout; tests and logs read it

    def _acquire(self) -> _Worker:
        """An idle worker, a new one if below ``max_workers``, or wait; re-checks capacity while waiting
        because a killed worker frees a slot without returning anything to the idle queue."""
        while True:
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                pass
            with self._lock:
                can_start = self._started < self.max_workers
                if can_start:
                    self._started += 1
            if can_start:
                try:
                    return _Worker()
                except BaseException:
                    with self._lock:
                        self._started -= 1
                    raise
            try:
                return self._idle.get(timeout=0.05)
            except queue.Empty:
                continue

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._started -= 1

    def check(self, prediction: str, ground_truth: str, timeout_s: float) -> bool:
        """True iff math-verify verifies ``prediction`` against ``ground_truth`` within ``timeout_s``."""
        return self.verdict(prediction, ground_truth, timeout_s).ok

    def verdict(self, prediction: str, ground_truth: str, timeout_s: float) -> Verdict:
        """:meth:`check`, with whether math-verify failed on the answer (an error it swallowed, or a timeout)."""
        # Each step (two parses, one verify) gets math-verify's own alarm of floor(timeout_s) whole seconds, so a
        # single runaway step usually ends without a kill; the hard deadline below bounds the total.
        return self._run(["verify", prediction, ground_truth, max(1, math.floor(timeout_s))], timeout_s)

    def parses(self, answer: str, timeout_s: float) -> bool:
        """True iff math-verify parses ``answer`` (bare or delimited) into a maths object within ``timeout_s``."""
        return self._run(["parses", answer, max(1, math.floor(timeout_s))], timeout_s).ok

    def _run(self, request: list, timeout_s: float) -> Verdict:
        """The worker's verdict on ``request``.

        Raises:
            VerifierCrash: the operation raised an exception math-verify did not handle (a programming error).
        """
        worker = self._acquire()
        reply = worker.ask(request, timeout_s)
        if reply is None:  # past the deadline (or dead): kill it so it cannot hold a slot; a verifier failure
            self.killed += 1
            self._discard(worker)
            return Verdict(False, failure=True)
        self._idle.put(worker)
        if "error" in reply:
            raise VerifierCrash(f"math-verify's check {request[0]!r} raised {reply['error']}: {reply['message']} "
                                f"(not a failure of math-verify on the answer: a programming error, so it is not "
                                f"scored 0). The worker's traceback:\n{reply['traceback']}")  # fmt: skip
        return Verdict(bool(reply["ok"]), bool(reply["failure"]))

    def close(self) -> None:
        while True:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                return
            self._discard(worker)


_pool: VerifierPool | None = None
_pool_lock = threading.Lock()


def get_pool() -> VerifierPool:
    """The process-wide pool, created on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = VerifierPool()
            atexit.register(_pool.close)
        return _pool


TIMEOUT_ENV = "BV_BLEND_REWARD_TIMEOUT_S"


def resolve_timeout(timeout_s: float | None) -> float:
    """``timeout_s``, else :data:`TIMEOUT_ENV` where set (a busy machine's checks need longer), else 5 s."""
    if timeout_s is None:
        text = os.environ.get(TIMEOUT_ENV)
        try:
            timeout_s = DEFAULT_TIMEOUT_S if text is None else float(text)
        except ValueError:
            raise ValueError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds: set it to one (e.g. 10), or "
                             "unset it for the default 5 s") from None  # fmt: skip
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s} (an argument, or {TIMEOUT_ENV})")
    return timeout_s


def verify_answer(prediction: str, ground_truth: str, timeout_s: float | None = None) -> bool:
    """Whether the final answer in ``prediction`` equals ``ground_truth`` by Math-Verify.

    ``prediction`` may be a whole response (the last ``\\boxed{}`` wins) or a bare expression.
    A malformed answer, or one whose check exceeds ``timeout_s`` seconds (:func:`resolve_timeout`), is ``False``.
    Safe to call from any thread.
    """
    return check_answer(prediction, ground_truth, timeout_s).ok


def check_answer(prediction: str, ground_truth: str, timeout_s: float | None = None) -> Verdict:
    """:func:`verify_answer`, with whether math-verify failed on the answer (an error it swallowed, a timeout).

    Raises:
        VerifierCrash: the check raised an exception math-verify did not handle (a programming error).
    """
    timeout_s = resolve_timeout(timeout_s)
    if not isinstance(prediction, str) or not isinstance(ground_truth, str):
        raise TypeError("prediction and ground_truth must be strings")
    if not prediction.strip() or not ground_truth.strip():
        return Verdict(False)
    return get_pool().verdict(prediction, ground_truth, timeout_s)


def answer_parses(answer: str, timeout_s: float | None = None) -> bool:
    """Whether Math-Verify can parse a reference answer into a maths object (not just a string)."""
    timeout_s = resolve_timeout(timeout_s)
    if not answer.strip():
        return False
    return get_pool().parses(answer, timeout_s)


def compute_score(
    data_source: str | None,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl custom reward function: score 1.0 if the response's final answer verifies, else 0.0 (no format reward).

    verl's reward loop calls ``compute_score(data_source=..., solution_str=..., ground_truth=...,
    extra_info=...)`` (plus reward-router keywords, ignored here). The timeout is
    ``extra_info["math_verify_timeout_s"]`` if given, else :func:`resolve_timeout`'s.

    Returns ``{"score", "acc", "verifier_failure"}``: verl takes ``score`` as the reward and carries the other keys
    as ``reward_extra_info`` (every row has the same keys, as verl's agent loop requires). ``acc`` is what verl sets
    for a float reward, kept so that DAPO's ``filter_groups.metric=acc`` still finds it; ``verifier_failure`` is 1.0
    where math-verify failed on the answer (a parse or verify error it swallowed, or a timeout).
    """
    given = (extra_info or {}).get("math_verify_timeout_s")
    verdict = check_answer(solution_str, str(ground_truth), timeout_s=None if given is None else float(given))
    score = 1.0 if verdict.ok else 0.0
    return {"score": score, "acc": score, FAILURE_KEY: 1.0 if verdict.failure else 0.0}


