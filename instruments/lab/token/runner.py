"""Run a suite unattended: skip finished runs, run the rest in worker processes, resume after an interruption.

The order: the warm-up (once, in this process, cached in DIR/warmup), then every available arm x seed x learning
rate; then the derived arms (their candidates' runs must all be finished, selection.best_by_final picks); then,
with ``lr_sweep``, the reference and the arm that comes out best at x0.5 and x2 the learning rate. Each finished
run is saved by the process that ran it (store.py); a run that raises is saved under DIR/failed with its error
and the suite goes on. A worker is a fresh process (spawn) with torch single-threaded.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from instruments import stats
from instruments.demo.standin import warmed_up_model
from instruments.lab.token import assets, selection
from instruments.lab.token import run as run_module
from instruments.lab.token.arms import REFERENCE, TokenArm, unavailable_reason
from instruments.lab.token.run import LabSettings, RunRecord
from instruments.lab.token.store import Store
from instruments.lab.token.suites import LR_SWEEP_FACTORS, Suite


@dataclass(frozen=True)
class Task:
    arm: TokenArm
    seed: int
    lr: float


@dataclass
class SuiteResults:
    """What a suite's folder holds, with the arms' availability and the derived arms' resolution."""

    suite: Suite
    arms: dict[str, TokenArm]  # the suite's arms, derived ones resolved where they could be
    records: dict[str, dict[float, list[RunRecord]]]  # arm key -> lr -> finished runs, in seed order
    unavailable: dict[str, str] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)  # derived arms not resolved yet, and why
    lr_sweep_arms: tuple[str, ...] = ()
    failures: dict[str, str] = field(default_factory=dict)

    def runs(self, key: str, lr: float | None = None) -> list[RunRecord]:
        return self.records.get(key, {}).get(self.suite.lr if lr is None else lr, [])

    def complete(self, key: str, lr: float | None = None) -> bool:
        return len(self.runs(key, lr)) == len(self.suite.seeds_at(self.suite.lr if lr is None else lr))


def run_suite(suite: Suite, out: Path, jobs: int = 1, lr_sweep: str | None = None,
              log: Callable[[str], None] = print) -> SuiteResults:
    """Run what is not finished yet; returns everything the folder then holds. ``lr_sweep``: "best" or a key."""
    suite.check()  # before the folder is claimed: refused settings leave nothing behind
    store = Store(out)
    store.open(suite.name, suite.settings)
    results = collect(suite, out)
    for key, reason in results.unavailable.items():
        log(f"[lab_token] {suite.table[key].label}: unavailable, skipped: {reason}")
    prepare_warmup(suite, store)
    fixed = [results.arms[key] for key in suite.arms if key not in results.unavailable and not suite.table[key].best_of]
    execute(suite, store, [Task(arm, seed, lr) for arm in fixed for seed in suite.seeds for lr in suite.lrs],
            jobs, "runs")
    results = collect(suite, out)
    derived = [results.arms[key] for key in suite.arms if suite.table[key].best_of and key not in results.unavailable]
    for key, why in results.pending.items():
        log(f"[lab_token] {suite.table[key].label}: not run: {why}")
    execute(suite, store, [Task(arm, seed, suite.lr) for arm in derived if not arm.best_of for seed in suite.seeds],
            jobs, "derived runs")
    results = collect(suite, out)
    if lr_sweep is not None:
        keys = lr_sweep_keys(results, lr_sweep)
        log(f"[lab_token] learning-rate check x{LR_SWEEP_FACTORS} for {keys}")
        tasks = [Task(results.arms[key], seed, suite.lr * factor)
                 for key in keys for factor in LR_SWEEP_FACTORS for seed in suite.sweep_seeds]
        execute(suite, store, tasks, jobs, "lr-check runs")
        results = collect(suite, out, lr_sweep)
    return results


def collect(suite: Suite, out: Path, lr_sweep: str | None = None) -> SuiteResults:
    """Read the finished runs of ``suite`` from ``out`` (runs nothing); resolves derived arms where it can."""
    store = Store(out)
    arms = {key: suite.table[key] for key in suite.arms}
    results = SuiteResults(suite, arms, {}, failures=store.failures())
    for key in suite.arms:
        reason = unavailable_reason(suite.table[key], suite.settings.num_clusters)
        if reason is not None:
            results.unavailable[key] = reason
    lrs = sorted({*suite.lrs, *(suite.lr * f for f in LR_SWEEP_FACTORS)})
    for key in suite.arms:
        if suite.table[key].best_of:
            continue
        _load(results, store, arms[key], lrs)
    for key in suite.arms:
        arm = suite.table[key]
        if not arm.best_of or key in results.unavailable:
            continue
        # every candidate must have run: resolving among fewer would change the arm when the others land
        missing = [c for c in arm.best_of if c in results.unavailable]
        if missing:
            results.pending[key] = f"it takes the best of {list(arm.best_of)}, and {missing} cannot run yet"
            continue
        candidates = list(arm.best_of)
        unfinished = [c for c in candidates if not results.complete(c)]
        if unfinished:
            results.pending[key] = f"the runs of {unfinished} are not all finished (it takes the best of them)"
            continue
        winner = selection.best_by_final({c: final_values(results.runs(c)) for c in candidates})
        arms[key] = arm.resolved(suite.table[winner])
        _load(results, store, arms[key], lrs)
    if lr_sweep is not None:
        results.lr_sweep_arms = tuple(lr_sweep_keys(results, lr_sweep))
    return results


def _load(results: SuiteResults, store: Store, arm: TokenArm, lrs: Sequence[float]) -> None:
    for lr in lrs:
        found = [store.load(arm, seed, lr) for seed in results.suite.seeds_at(lr)]
        runs = [r for r in found if r is not None]
        if runs:
            results.records.setdefault(arm.key, {})[lr] = runs


def final_values(runs: Sequence[RunRecord]) -> list[float]:
    return [r.pass_rate[-1] for r in runs]


def lr_sweep_keys(results: SuiteResults, choice: str) -> list[str]:
    """The reference and the arms the learning-rate check is for: ``choice`` is an arm key, "best" (the full
    suite's rule: the fewest rollouts to reach) or "regime" (results/regime.md: REINFORCE++ n=1 and the package's best
    arm by instruments.rule.best_package_arm)."""
    if choice == "regime":
        from instruments.lab.token import regime

        return regime.lr_check_keys(results)
    if choice != "best":
        if choice not in results.arms:
            raise ValueError(f"--lr-sweep {choice}: not an arm of the suite ({', '.join(results.arms)})")
        return [REFERENCE] if choice == REFERENCE else [REFERENCE, choice]
    reference = results.runs(REFERENCE)
    candidates = [k for k in results.suite.arms if k != REFERENCE and results.complete(k)]
    if not results.complete(REFERENCE) or not candidates:
        raise ValueError("--lr-sweep best needs the comparison's runs of the reference and of another arm finished")
    ref_curves = np.array([r.pass_rate for r in reference])
    x = lambda key: np.array(results.runs(key)[0].eval_steps) * results.suite.settings.budget  # noqa: E731
    ratios = {k: stats.reach_ratio(np.array([r.pass_rate for r in results.runs(k)]), ref_curves, x(k), x(REFERENCE))
              for k in candidates}
    best = selection.best_by_reach(ratios, {k: final_values(results.runs(k)) for k in candidates})
    return [REFERENCE, best]


def prepare_warmup(suite: Suite, store: Store) -> None:
    """Warm the model up once, here, so that every worker loads it from the cache; with them, the codebook's
    clusters of the pool and the offline priors (assets.py)."""
    torch.set_num_threads(1)
    settings = suite.settings
    val = run_module.held_out(settings)
    model, tokenizer = warmed_up_model(settings.standin(str(store.cache)), {p.question for p in val})
    pool = run_module.pool_of(settings, val)
    if settings.clusters == "codebook":
        assets.build_clusters(settings, store.cache, pool)
    if any(suite.table[key].priors for key in suite.arms):
        assets.build_priors(settings, store.cache, pool, model, tokenizer)


def execute(suite: Suite, store: Store, tasks: Sequence[Task], jobs: int, desc: str) -> None:
    """Run the tasks whose result file is missing, ``jobs`` at a time, with a progress bar."""
    pending = [t for t in tasks if store.load(t.arm, t.seed, t.lr) is None]
    if not tasks:
        return
    progress = tqdm(total=len(tasks), initial=len(tasks) - len(pending), desc=desc, unit="run", dynamic_ncols=True)
    jobs_args = [(suite.settings, t.arm, t.seed, t.lr, str(store.out)) for t in pending]
    if jobs <= 1 or len(pending) <= 1:
        outcomes = map(_execute, jobs_args)
        _report(outcomes, progress)
    else:
        # spawn: a fresh interpreter per worker (no torch thread pool or verl state inherited from this process)
        context = multiprocessing.get_context("spawn")
        with context.Pool(min(jobs, len(pending)), initializer=_single_thread) as pool:
            _report(pool.imap_unordered(_execute, jobs_args, chunksize=1), progress)
    progress.close()


def _report(outcomes, progress: tqdm) -> None:
    for label, seed, lr, message in outcomes:
        progress.update()
        progress.write(f"[lab_token] {label}, seed {seed}, lr {lr:g}: {message}")


def _execute(args: tuple[LabSettings, TokenArm, int, float, str]) -> tuple[str, int, float, str]:
    """Run one task and save its result (in the worker); returns a line for the log."""
    settings, arm, seed, lr, out = args
    store = Store(Path(out))
    try:
        record = run_module.run(settings, arm, seed, lr, str(store.cache))
    except Exception as error:  # noqa: BLE001  (one failing run must not stop an unattended suite)
        store.save_failure(arm, seed, lr, "".join(traceback.format_exception(error)))
        return arm.label, seed, lr, f"FAILED: {type(error).__name__}: {error} (see {store.failed})"
    store.save(arm, record)
    seconds = record.train_seconds + record.eval_seconds
    return arm.label, seed, lr, (f"held-out {record.pass_rate[0]:.3f} -> {record.pass_rate[-1]:.3f} "
                                 f"in {seconds:.0f} s ({record.eval_seconds:.0f} s evaluating)")


def _single_thread() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
