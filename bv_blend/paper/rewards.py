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
from typing import Any

DEFAULT_TIMEOUT_S = 5.0
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


def _worker_main() -> None:
    """Worker loop on stdin/stdout: one JSON request per line, one JSON bool per line back."""
    import logging

    # math-verify logs every parse failure and timeout at warning level; a reward of 0 says it all.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify  # noqa: F401  (import before signalling ready, so it does not count against a check)

    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        operation, *args = json.loads(line)
        try:
            result = _OPERATIONS[operation](*args)
        except Exception:  # any failure inside math-verify (malformed LaTeX, sympy errors) is "not verified"
            result = False
        out.write("true\n" if result else "false\n")
        out.flush()


class _Worker:
    """One math-verify process. A plain ``python -c`` child, not multiprocessing: spawn would re-import
    the caller's ``__main__`` (a hazard for scripts without a main guard), and fork would copy a
    threaded parent mid-lock."""

    def __init__(self) -> None:
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

    def ask(self, request: list, timeout_s: float) -> bool | None:
        """The worker's verdict on ``[operation, *args]``, or None if it did not answer within ``timeout_s``."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        answer = self._readline(timeout_s)
        return None if answer is None else answer == "true"

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
        # Each step (two parses, one verify) gets math-verify's own alarm of floor(timeout_s) whole seconds, so a
        # single runaway step usually ends without a kill; the hard deadline below bounds the total.
        return self._run(["verify", prediction, ground_truth, max(1, math.floor(timeout_s))], timeout_s)

    def parses(self, answer: str, timeout_s: float) -> bool:
        """True iff math-verify parses ``answer`` (bare or delimited) into a maths object within ``timeout_s``."""
        return self._run(["parses", answer, max(1, math.floor(timeout_s))], timeout_s)

    def _run(self, request: list, timeout_s: float) -> bool:
        worker = self._acquire()
        verdict = worker.ask(request, timeout_s)
        if verdict is None:  # past the deadline (or dead): kill it so it cannot hold a slot
            self.killed += 1
            self._discard(worker)
            return False
        self._idle.put(worker)
        return verdict

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


def verify_answer(prediction: str, ground_truth: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether the final answer in ``prediction`` equals ``ground_truth`` by Math-Verify.

    ``prediction`` may be a whole response (the last ``\\boxed{}`` wins) or a bare expression.
    A malformed answer, or one whose check exceeds ``timeout_s`` seconds, is ``False``.
    Safe to call from any thread.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if not isinstance(prediction, str) or not isinstance(ground_truth, str):
        raise TypeError("prediction and ground_truth must be strings")
    if not prediction.strip() or not ground_truth.strip():
        return False
    return get_pool().check(prediction, ground_truth, timeout_s)


def answer_parses(answer: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether Math-Verify can parse a reference answer into a maths object (not just a string)."""
    if not answer.strip():
        return False
    return get_pool().parses(answer, timeout_s)


def compute_score(
    data_source: str | None,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> float:
    """verl custom reward function: 1.0 if the response's final answer verifies, else 0.0 (no format reward).

    verl's reward loop calls ``compute_score(data_source=..., solution_str=..., ground_truth=...,
    extra_info=...)`` (plus reward-router keywords, ignored here). The timeout is
    ``extra_info["math_verify_timeout_s"]`` if given, else ``BV_BLEND_REWARD_TIMEOUT_S``, else 5 s.
    """
    env_timeout = os.environ.get("BV_BLEND_REWARD_TIMEOUT_S", DEFAULT_TIMEOUT_S)
    timeout_s = float((extra_info or {}).get("math_verify_timeout_s") or env_timeout)
    return 1.0 if verify_answer(solution_str, str(ground_truth), timeout_s=timeout_s) else 0.0


