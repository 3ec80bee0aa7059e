"""Experiments: arms run over the same seeds, each paired with a reference arm; optionally at matched step sizes.

An arm is one setting (estimator, environment, optimizer, codebook). Its runs on seeds 0..n-1 see the same random
numbers as its reference arm's runs on the same seeds (GRPO at the same setting), so differences are paired.

Step-size matching: an estimator whose advantages are larger takes larger steps, so "learns faster" can mean
"has a larger learning rate". A matched experiment first runs a short pilot of every arm on the same seeds and
scales each arm's learning rate by mean|delta theta| of its reference / mean|delta theta| of the arm, then runs
again. With SGD, delta theta = lr * gradient, so this equalises the mean gradient norms; Adam divides the
gradient's scale out itself, so what is equalised there is how far a step moves the parameters.

Resuming: with a ``cache`` folder, every finished run is pickled there under a hash of its spec (written atomically),
and a later call with the same folder reads it instead of running it again, so an interrupted suite continues where
it stopped. A spec is everything that determines a run's numbers, so a changed setting is a new run, never a mix.
"""

from __future__ import annotations

import functools
import hashlib
import multiprocessing
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from instruments.lab.estimators import sampler_reason, unavailable_reason
from instruments.lab.run import RunResult, RunSpec, run


@dataclass(frozen=True)
class Arm:
    label: str
    spec: RunSpec  # its seed is replaced by each seed of the experiment
    reference: str | None = None  # the label of the arm it is paired with; None for a reference arm
    sweep: str = ""  # the swept setting (for plots), e.g. "G=4"
    match: bool = True  # in a matched experiment, also run it step-size matched (a reference arm always is)


@dataclass(frozen=True)
class Experiment:
    key: str
    title: str
    arms: tuple[Arm, ...]
    matched: bool = False


@dataclass
class ArmResult:
    arm: Arm
    runs: list[RunResult]
    lr_scale: float = 1.0


@dataclass
class ExperimentResult:
    experiment: Experiment
    arms: dict[str, ArmResult] = field(default_factory=dict)
    matched: dict[str, ArmResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # label -> why


def run_experiments(
    experiments: Sequence[Experiment],
    seeds: int,
    pilot_steps: int,
    jobs: int = 1,
    log: Callable[[str], None] = print,
    cache: Path | None = None,
) -> list[ExperimentResult]:
    """Run every arm of every experiment on seeds 0..seeds-1 (identical runs shared), then the matched reruns."""
    results = [ExperimentResult(experiment) for experiment in experiments]
    noted: set[str] = set()
    for result in results:
        for arm in result.experiment.arms:
            reason = unavailable_reason(arm.spec.estimator) or sampler_reason(arm.spec.estimator, arm.spec.sampler)
            if reason is not None:
                result.skipped[arm.label] = reason
                what = arm.spec.estimator.label + (f" with the {arm.spec.sampler} sampler" if arm.spec.sampler else "")
                if what not in noted:
                    noted.add(what)
                    log(f"[lab] note: skipping {what!r} (every experiment): {reason}")

    def runnable(result: ExperimentResult) -> list[Arm]:
        return [arm for arm in result.experiment.arms if arm.label not in result.skipped]

    def to_match(result: ExperimentResult) -> list[Arm]:
        if not result.experiment.matched:
            return []
        return [arm for arm in runnable(result) if arm.match or arm.reference is None]

    def seeded(spec: RunSpec, **changes: object) -> list[RunSpec]:
        return [replace(spec, seed=seed, **changes) for seed in range(seeds)]

    # Phase 1: every arm, and the pilots of matched experiments.
    wanted: list[RunSpec] = []
    for result in results:
        for arm in runnable(result):
            wanted += seeded(arm.spec)
        for arm in to_match(result):
            wanted += seeded(arm.spec, steps=min(pilot_steps, arm.spec.steps))
    done = _run_many(wanted, jobs, "runs", cache)
    for result in results:
        for arm in runnable(result):
            result.arms[arm.label] = ArmResult(arm, [done[spec] for spec in seeded(arm.spec)])

    # Phase 2: matched reruns, lr scaled by the pilots' mean update norms.
    scales: dict[tuple[int, str], float] = {}
    for index, result in enumerate(results):
        arms = {arm.label: arm for arm in to_match(result)}
        for arm in arms.values():
            reference = arms.get(arm.reference or arm.label)
            if reference is None:
                continue
            pilot = [done[s] for s in seeded(arm.spec, steps=min(pilot_steps, arm.spec.steps))]
            reference_pilot = [done[s] for s in seeded(reference.spec, steps=min(pilot_steps, reference.spec.steps))]
            scales[index, arm.label] = _mean_update_norm(reference_pilot) / _mean_update_norm(pilot)
    matched_specs = [
        spec
        for (index, label), scale in scales.items()
        for spec in seeded(_arm(results[index], label).spec, lr_scale=scale)
    ]
    # A reference's scale is 1: its matched runs are its raw runs, already done.
    done.update(_run_many([spec for spec in matched_specs if spec not in done], jobs, "matched runs", cache))
    for (index, label), scale in scales.items():
        arm = _arm(results[index], label)
        runs = [done[spec] for spec in seeded(arm.spec, lr_scale=scale)]
        results[index].matched[label] = ArmResult(arm, runs, lr_scale=scale)
    return results


def _arm(result: ExperimentResult, label: str) -> Arm:
    return next(arm for arm in result.experiment.arms if arm.label == label)


def _mean_update_norm(runs: Sequence[RunResult]) -> float:
    return float(np.mean([run.update_norm.mean() for run in runs]))


def _cache_file(cache: Path, spec: Any) -> Path:
    return cache / (hashlib.sha256(repr(spec).encode()).hexdigest()[:24] + ".pkl")


def _cached(cache: Path | None, spec: Any) -> Any:
    if cache is None or not _cache_file(cache, spec).exists():
        return None
    with open(_cache_file(cache, spec), "rb") as handle:
        saved_spec, result = pickle.load(handle)
    return result if saved_spec == spec else None  # a hash collision is a new run


def _store(cache: Path | None, spec: Any, result: Any) -> None:
    if cache is None:
        return
    cache.mkdir(parents=True, exist_ok=True)
    path = _cache_file(cache, spec)
    partial = path.with_suffix(".tmp")
    with open(partial, "wb") as handle:
        pickle.dump((spec, result), handle)
    partial.replace(path)  # atomic: an interrupted write is not taken for a finished run


def _run_many(specs: Sequence[RunSpec], jobs: int, desc: str, cache: Path | None = None) -> dict[RunSpec, RunResult]:
    """Run each distinct spec once, longest first (:func:`run_cached`)."""
    unique = sorted(dict.fromkeys(specs), key=lambda spec: -spec.steps)
    return run_cached(unique, run, jobs, desc, cache)[0] if unique else {}


def run_cached(specs: Sequence[Any], run_one: Callable[[Any], Any], jobs: int, desc: str,
               cache: Path | None = None) -> tuple[dict[Any, Any], int]:
    """``run_one`` of each distinct spec once (in ``jobs`` forked processes), in order, with a progress bar; runs
    already in ``cache`` are read, not run. Returns the results and how many were run. ``run_one`` must be a module
    function (the workers receive it by name)."""
    unique = list(dict.fromkeys(specs))
    out = {spec: result for spec in unique if (result := _cached(cache, spec)) is not None}
    todo = [spec for spec in unique if spec not in out]
    progress = tqdm(total=len(unique), initial=len(out), desc=desc, unit="run", dynamic_ncols=True)
    if jobs <= 1:
        for spec in todo:
            out[spec] = run_one(spec)
            _store(cache, spec, out[spec])
            progress.update()
    elif todo:
        # fork: workers inherit the imported verl and bv_blend (spawning would import verl again in each)
        with multiprocessing.get_context("fork").Pool(jobs, initializer=_single_thread) as pool:
            for spec, result in pool.imap_unordered(functools.partial(_run_pair, run_one), todo, chunksize=1):
                out[spec] = result
                _store(cache, spec, result)
                progress.update()
    progress.close()
    return out, len(todo)


def _run_pair(run_one: Callable[[Any], Any], spec: Any) -> tuple[Any, Any]:
    return spec, run_one(spec)


def _single_thread() -> None:
    import torch

    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
