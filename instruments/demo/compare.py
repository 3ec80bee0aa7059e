"""The multi-seed comparison behind scripts/compare_cpu.py: named arms (a verl estimator, its overrides, a group size),
several seeds, on verl's stock trainer on CPU, each run validated on the demo's held-out prompts; tables, a plot,
docs/benchmarks.md (the tables, plot and doc section: instruments.demo.compare_report).

An arm is declared once, in :data:`ARMS` (its estimator and the hydra overrides on top of the demo's), and run at a
group size n (``grpo:8``). Every arm of a comparison gets the same rollout budget per step (``rollouts_per_step`` =
prompts x n), so a smaller group sees more prompts. A seed sets the order of training prompts (or the sampler's
draws) and vLLM's sampling; every run of a comparison shares one task, training pool, warmed-up model and codebook
(prepared once, in ``<out>/prepared``), so the runs of one seed differ only by their arm, and every arm is compared
with a reference arm paired by seed.

Resuming: a run is done when its ``result.json`` exists (written atomically after the run has finished and been
read); a restarted comparison skips done runs. Each run saves verl's checkpoint at every validation step, and a run
that was interrupted resumes from its latest usable one (instruments.demo.resume: a SmolLM2 run is about an hour);
one without a checkpoint restarts from scratch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from bv_blend.core.jsonl import jsonl_records
from instruments.demo import report, resume
from instruments.demo.pipeline import DemoSettings, Prepared
from instruments.demo.verl_run import follow_steps, run_method
from instruments.machine import describe_cpu
from instruments.provenance import code_commit

RESULT_FILE = "result.json"


# ------------------------------------------------------------------------------------------------------- arms
@dataclass(frozen=True)
class Arm:
    """What one arm runs: a verl estimator (``algorithm.adv_estimator``) and hydra overrides on top of the demo's."""

    estimator: str
    overrides: tuple[str, ...] = ()
    about: str = ""

    @property
    def samples_by_history(self) -> bool:
        return SAMPLER_ON in self.overrides

    @property
    def reads_priors(self) -> bool:
        return any(PRIORS_FILE in o for o in self.overrides)


# Where an arm reads the offline priors (docs/priors.md): the comparison's own file, made once in its shared
# preparation (instruments.demo.no_revisit.prepare_priors). The arm's stored definition names the file by this
# placeholder, replaced by the path only when the run starts (:func:`run_overrides`), so that what the arm runs
# does not depend on where the comparison's folder is.
PRIORS_FILE = "PREPARED_PRIORS_FILE"
# cpu_tiny declares no spo section (SPO runs on its defaults): "++" adds the option, or sets it where declared
SPO_PRIORS = (f"++algorithm.spo.offline_values={PRIORS_FILE}",)
BV_PRIORS = (f"algorithm.bv_blend.prior_file={PRIORS_FILE}",)

# the history-driven prompt sampler and what it needs (bv_blend/verl/sampler.py refuses a run without them)
SAMPLER_ON = "data.history_sampler.enable=true"
SAMPLER = (SAMPLER_ON, "data.shuffle=true", "data.dataloader_num_workers=0")
PROMPT_LEVEL = ("algorithm.bv_blend.history_level=prompt_and_cluster",)

# Every arm a comparison can run, by name. What an arm runs is stored in each of its results and compared on
# resume, so changing an entry refuses the results made with the old one: give a changed arm a new name.
ARMS: dict[str, Arm] = {
    "grpo": Arm("grpo", (), "GRPO: the group mean as baseline"),
    "bv_blend": Arm("bv_blend", (), "BV-Blend, the cluster's history (the paper)"),
    "bv_blend_prompt": Arm("bv_blend", PROMPT_LEVEL, "BV-Blend, the prompt's history blended over its cluster's"),
    "bv_blend_sampler": Arm("bv_blend", SAMPLER, "BV-Blend (cluster history), prompts drawn by the history"),
    "bv_blend_prompt_sampler": Arm("bv_blend", PROMPT_LEVEL + SAMPLER,
                                   "BV-Blend at the prompt level, prompts drawn by the history"),
    "spo": Arm("spo", (), "SPO: each prompt's Beta tracker as baseline, normalised over the batch"),
    "spo_sampler": Arm("spo", SAMPLER, "SPO, prompts drawn by its tracker (sqrt(p(1-p)) + 0.05)"),
    # verl's own, no history: the rewards whitened over the batch, so at n = 1 the batch mean is the baseline (the
    # token lab's best arm; the NTF paper runs it this way)
    "reinforce_plus_plus": Arm("reinforce_plus_plus", (), "REINFORCE++ (verl's): the batch mean as baseline"),
    # the no-revisit regime's arms with offline priors (docs/regime.md, addendum): the only history they can have
    "spo_priors": Arm("spo", SPO_PRIORS, "SPO, each prompt's tracker started from the offline priors"),
    "bv_blend_prompt_priors": Arm("bv_blend", PROMPT_LEVEL + BV_PRIORS,
                                  "BV-Blend at the prompt level, its prompts and clusters started from the offline "
                                  "priors"),
    # verl's own answer to zero-variance groups (DAPO's dynamic sampling, in core): all-equal groups are dropped and
    # more prompts generated until the batch is full; every generated rollout counts in its budget
    "grpo_dynamic": Arm("grpo", ("algorithm.filter_groups.enable=true",),
                        "GRPO with DAPO's dynamic sampling (verl's algorithm.filter_groups)"),
    # the seeds' companions (docs/companions.md), on their defaults
    "ha_dw": Arm("ha_dw", (), "HA-DW: GRPO reweighted by the history-anchored difficulty"),
    "maxnorm_rloo": Arm("maxnorm_ac", ("++algorithm.maxnorm.numerator=rloo",),
                        "MaxNorm-AC with the RLOO numerator (its paper's main instance)"),
    "reinforce_plus_plus_ntf": Arm("reinforce_plus_plus", (
        "actor_rollout_ref.actor.policy_loss._target_=bv_blend.verl.glue.ntf.NTFPolicyLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=ntf"),
        "REINFORCE++ with negative token filtering (its paper's setting: one rollout a prompt)"),
}


@dataclass(frozen=True)
class RunSpec:
    """One verl run of the comparison: an arm at a group size and a seed."""

    arm: str
    n: int  # group size (rollouts per prompt)
    batch: int  # prompts per step
    seed: int
    estimator: str
    overrides: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.arm}_n{self.n}_seed{self.seed}"

    @property
    def label(self) -> str:
        return arm_label(self.arm, self.n, self.batch)

    @property
    def samples_by_history(self) -> bool:
        return SAMPLER_ON in self.overrides

    @property
    def reads_priors(self) -> bool:
        return any(PRIORS_FILE in o for o in self.overrides)

    def describe(self) -> dict:
        """What decides this run's result, as stored in its result.json (JSON has no tuples)."""
        return {**asdict(self), "overrides": list(self.overrides)}


def run_overrides(spec: RunSpec, priors: Path | None) -> tuple[str, ...]:
    """The arm's overrides as the run passes them: the priors placeholder replaced by the preparation's file."""
    if not spec.reads_priors:
        return spec.overrides
    if priors is None:
        raise ValueError(f"{spec.name} reads the offline priors, and the preparation has none: make them first "
                         "(instruments.demo.no_revisit.prepare_priors; scripts/compare_cpu.py runs it for such arms)")
    return tuple(o.replace(PRIORS_FILE, str(priors)) for o in spec.overrides)


def arm_label(arm: str, n: int, batch: int) -> str:
    return f"{arm} n={n} ({batch} prompts)"


def parse_arm(text: str) -> tuple[str, int]:
    """``"grpo:8"`` -> ``("grpo", 8)``; raises ValueError with the arms there are."""
    name, sep, n = text.partition(":")
    if not sep or not n.strip().isdigit():
        raise ValueError(f"{text!r} is not ARM:N (an arm and its group size, e.g. grpo:8)")
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; the arms are {', '.join(ARMS)} (instruments/demo/compare.py, ARMS)")
    return name, int(n)


def grid(arms: Sequence[tuple[str, int]], rollouts_per_step: int, seeds: Sequence[int]) -> list[RunSpec]:
    """Every (seed, arm), seeds outermost: an interrupted comparison has whole seeds done first."""
    for name, n in arms:
        if name not in ARMS:
            raise ValueError(f"unknown arm {name!r}; the arms are {', '.join(ARMS)}")
        if n < 1 or rollouts_per_step % n:
            raise ValueError(f"group size {n} of {name} must be >= 1 and divide --rollouts-per-step "
                             f"{rollouts_per_step}, so that every arm gets the same number of rollouts per step")
    if len(set(seeds)) != len(seeds) or len(set(arms)) != len(arms):
        raise ValueError(f"seeds {list(seeds)} and arms {[f'{a}:{n}' for a, n in arms]} must not repeat")
    return [RunSpec(name, n, rollouts_per_step // n, seed, ARMS[name].estimator, ARMS[name].overrides)
            for seed in seeds for name, n in arms]


def pool_size(specs: Sequence[RunSpec], steps: int, train_prompts: int | None) -> int:
    """Training rows every run draws from: ``train_prompts``, or steps x the largest batch (every prompt seen once by
    the arm with the most prompts a step; a per-prompt history then never sees a prompt again)."""
    largest = max(spec.batch for spec in specs)
    if train_prompts is None:
        return steps * largest
    if train_prompts < largest:
        raise ValueError(f"--train-prompts {train_prompts} is smaller than the largest batch ({largest} prompts a "
                         "step): a batch holds distinct prompts")
    return train_prompts


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def settings_key(s: DemoSettings) -> dict[str, str]:
    """What a result depends on besides its RunSpec: a restart must use the same, or its results would mix. The
    training pool's size is the preparation's ``n_train``."""
    keys = ("steps", "lr", "val_samples", "test_freq")
    return {**s.preparation_key(), **{k: str(getattr(s, k)) for k in keys}, **s.run_key()}


# ------------------------------------------------------------------------------------------------ bookkeeping
def run_dir(out: Path, spec: RunSpec) -> Path:
    return out / "runs" / spec.name


def load_result(out: Path, spec: RunSpec, key: dict[str, str]) -> dict | None:
    """The saved result of a finished run, or None when the run has not finished.

    Raises if the result was made with other settings or another definition of its arm: mixing them would make the
    comparison meaningless.
    """
    path = run_dir(out, spec) / RESULT_FILE
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    if result["settings"] != key or result["spec"] != spec.describe():
        raise ValueError(f"{path} was made with other settings ({result['settings']}, {result['spec']}); "
                         f"now {key}, {spec.describe()}. Use another --out folder, or the command that made it.")
    return result


def pending(out: Path, specs: Sequence[RunSpec], key: dict[str, str]) -> list[RunSpec]:
    """The runs without a saved result, in order."""
    return [spec for spec in specs if load_result(out, spec, key) is None]


def memory_needed(out: Path, specs: Sequence[RunSpec], key: dict[str, str]) -> tuple[float, str] | None:
    """The most memory a finished run of this comparison held (GiB), and which run: what its next run needs (every
    run has the same settings and rollouts a step); None before any run recorded it (results made before
    ``peak_memory_gib`` was recorded have none)."""
    held = [(result["peak_memory_gib"], spec.name) for spec in specs
            if (result := load_result(out, spec, key)) is not None and "peak_memory_gib" in result]
    return max(held) if held else None


def save_result(out: Path, spec: RunSpec, result: dict) -> Path:
    """Writes result.json atomically: a run interrupted while saving is not taken for finished."""
    path = run_dir(out, spec) / RESULT_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, path)
    return path


def fresh_run_dir(out: Path, spec: RunSpec) -> Path:
    """An empty folder for a run: what an interrupted attempt left there is removed (the run restarts)."""
    path = run_dir(out, spec)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def resumable_run_dir(out: Path, spec: RunSpec) -> tuple[Path, Path | None]:
    """The run's folder and the checkpoint to resume from: an interrupted attempt's latest usable checkpoint (its
    folder set back to it), or none (an empty folder: the run starts from scratch)."""
    path = run_dir(out, spec)
    step = resume.resume_step(path) if path.is_dir() else None
    if step is None:
        fresh_run_dir(out, spec)
        resume.start_attempt(path, None)
        return path, None
    resume.prepare_resume(path, step)
    resume.start_attempt(path, step)
    return path, path / resume.CHECKPOINTS / f"global_step_{step}"


# ------------------------------------------------------------------------------------ what a run logged besides
ADV_MAX, ADV_MIN = "critic/advantages/max", "critic/advantages/min"  # verl's, over the valid tokens of a step
OWN_ABS_MAX = ("bv_blend/abs_advantage_max",)  # an estimator's own, where verl's is missing
TESTING_TIME = "timing_s/testing"
SAMPLER_PREFIX = "sampler/"
ADVISOR_PREFIX = "advisor/"  # the start-time advisor's planned visits (arithmetic from the run's sizes)
SPO_P_HAT = "spo/p_hat_mean"  # SPO's mean p^ over a batch's prompts: what the sampler moves, with or without it
# Which estimators' "signal" (share of groups that get a non-zero advantage) the demo's reader defines: GRPO's
# from the groups' scores, BV-Blend's logged; SPO gives every row r - p^, so a share of groups says nothing.
SIGNAL_DEFINED = ("grpo", "bv_blend")


def max_abs_advantage(metrics: pd.DataFrame) -> float:
    """The largest |A| of any token of the run: verl's ``critic/advantages/max|min``, else the estimator's own."""
    train = report.training_steps(metrics)
    if ADV_MAX in train and ADV_MIN in train:
        return float(max(train[ADV_MAX].abs().max(), train[ADV_MIN].abs().max()))
    own = [train[c].max() for c in OWN_ABS_MAX if c in train]
    return float(max(own)) if own else float("nan")


def between_steps_s(metrics: pd.DataFrame, rollout_dir: Path, resumed_from: Sequence[int] = ()) -> float:
    """Mean wall time a step spends outside verl's step timer and its validation, from the rollout dump's times.

    verl's V1 trainer (the one the CPU harness runs, trainer/ppo/v1/trainer_base.py ``fit``) times ``step`` from
    fetching the step's batch (``prepare_step``: the history sampler's draw) to the actor update, then validates
    (``timing_s/testing``), computes the step's metrics, dumps its rollouts (``rollouts/<step>.jsonl``) and logs. So
    between the dumps of steps k and k+1 lie the logging of step k, step k+1, its validation and its metrics; this
    subtracts the two timed parts, leaving what no timer of verl covers. The dump is written by verl's one-thread
    executor, a few milliseconds after it is handed over: a mean over steps is exact to about that. The gap after
    step 1 is left out (step 2 of a run is still warming up vLLM's and the agent loop's first-use paths), and so is
    the gap after each step a resumed run restarted from (it spans the interruption and a whole start-up).
    """
    times = {int(p.stem): p.stat().st_mtime for p in rollout_dir.glob("*.jsonl") if p.stem.isdigit()}
    train = report.training_steps(metrics)
    gaps = []
    for k in sorted(times):
        if k < 2 or k in resumed_from or k + 1 not in times or k + 1 not in train.index:
            continue
        testing = train.at[k + 1, TESTING_TIME] if TESTING_TIME in train else float("nan")
        gaps.append(times[k + 1] - times[k] - train.at[k + 1, report.STEP_TIME]
                    - (0.0 if math.isnan(testing) else testing))
    return float(np.mean(gaps)) if gaps else float("nan")


def extra_summary(metrics: pd.DataFrame, rollout_dir: Path, resumed_from: Sequence[int] = ()) -> dict[str, float]:
    """The comparison's numbers beyond the demo's run summary: max |A|, the advantage step's time, the time between
    steps, and the means over training steps of the sampler's and SPO's logged metrics (absent when not logged)."""
    train = report.training_steps(metrics)
    steady = train.iloc[1:] if len(train) > 1 else train  # step 1 holds vLLM's first-use costs
    out = {
        "max |A|": max_abs_advantage(metrics),
        "adv time ms": 1000 * float(steady[report.ADV_TIME].mean()) if report.ADV_TIME in steady else float("nan"),
        "between steps s": between_steps_s(metrics, rollout_dir, resumed_from),
    }
    for column in sorted(c for c in train.columns if c.startswith((SAMPLER_PREFIX, ADVISOR_PREFIX)) or c == SPO_P_HAT):
        out[column] = float(train[column].mean())
    return out


def visits_per_prompt(rollout_dir: Path) -> dict[str, float]:
    """How often the run drew each prompt, counted in verl's rollout dump (``rollouts/<step>.jsonl``): a draw is one
    sample of a step's batch (the dump's ``uid`` is ``<sample>_<session>_<output>``: one group), a prompt its text as
    verl sent it. ``max`` and ``mean`` visits over the drawn prompts, ``prompts`` drawn, ``draws`` in all. A dump
    without uids counts a prompt once a step (a prompt drawn twice in one batch would then count once)."""
    draws: dict[str, set[tuple[int, str]]] = {}
    for path in sorted(rollout_dir.glob("*.jsonl")):
        if not path.stem.isdigit():
            continue
        for row in jsonl_records(path):
            sample = row["uid"].rsplit("_", 2)[0] if "uid" in row else ""
            draws.setdefault(row["input"], set()).add((int(row.get("step", path.stem)), sample))
    if not draws:
        raise ValueError(f"{rollout_dir} holds no rollout dump: the visits per prompt cannot be counted")
    visits = np.array([len(d) for d in draws.values()], dtype=float)
    return {"max": float(visits.max()), "mean": float(visits.mean()), "prompts": float(len(visits)),
            "draws": float(visits.sum())}


def verl_ended_utc(attempts: Sequence[dict]) -> str:
    """When verl's last attempt ended (a run read again after a reader's failure ended then, not at its reading)."""
    last = attempts[-1]
    return datetime.fromtimestamp(last["started_unix"] + last["wall_s"], timezone.utc).isoformat(timespec="seconds")


# verl's dynamic sampling (algorithm.filter_groups) logs what it drew beyond the batch: kept with the result, so that
# its arm is judged at the rollouts it generated (docs/regime.md, the pretrained-LM comparison)
FILTER_GROUPS_PREFIX = "training/filter_groups/"


def result_of(spec: RunSpec, key: dict[str, str], record: report.RunRecord, wall_s: float,
              rollout_dir: Path | None = None, resumed_from: Sequence[int] = ()) -> dict:
    """What the tables and plots need from one run, small enough to keep forever."""
    summary = record.summary()
    summary["all-equal %"] = summary["all-right %"] + summary["all-wrong %"]
    visits = {}
    if rollout_dir is not None:
        summary |= extra_summary(record.metrics, rollout_dir, resumed_from)
        visits = {"visits": visits_per_prompt(rollout_dir)}
    return {
        "spec": spec.describe(),
        "settings": key,
        "validation": {str(step): float(v) for step, v in record.validation[report.OVERALL].items()},
        "families_after": {f: float(v) for f, v in record.validation.loc[record.last_val].items()},
        "signal": {str(step): float(v) for step, v in record.signal.items()},
        "summary": summary,
        "wall_s": wall_s,
        "cpu": describe_cpu(),  # a comparison that resumes on another machine has runs from several kinds of CPU
        **visits,
        **filter_groups_of(record.metrics),
    }


def filter_groups_of(metrics: pd.DataFrame) -> dict:
    """Per step, what verl's dynamic sampling logged (``training/filter_groups/*``); nothing for other runs."""
    columns = [c for c in metrics.columns if c.startswith(FILTER_GROUPS_PREFIX)]
    if not columns:
        return {}
    steps = report.training_steps(metrics)[columns]
    return {"filter_groups": {c[len(FILTER_GROUPS_PREFIX):]: {str(int(step)): float(v) for step, v in
                                                               steps[c].dropna().items()} for c in columns}}


def generated_rollouts(result: dict, steps: Sequence[int]) -> np.ndarray:
    """The rollouts a run generated up to each of ``steps``: its batch's n x prompts a step, plus the groups verl's
    dynamic sampling drew beyond it (``training/filter_groups/evicted_samples`` and ``discarded_surplus_samples``,
    kept per step in the result by filter_groups_of; none logged at a step: none drawn), n rollouts each.

    Despite their names, verl counts those two in prompt groups (``len(dapo_uids)``, ``len(surplus_uids)`` in its
    sync ReplayBuffer), not rollouts: tests/verl/test_v1_advantage_step.py holds them to verl's own buffer."""
    spec, drawn = result["spec"], result.get("filter_groups", {})
    extra = {int(step): 0.0 for step in range(1, max(steps) + 1)}
    for name in ("evicted_samples", "discarded_surplus_samples"):
        for step, groups in drawn.get(name, {}).items():
            extra[int(step)] = extra.get(int(step), 0.0) + groups * spec["n"]
    per_step = np.array([spec["n"] * spec["batch"] + extra[step] for step in range(1, max(steps) + 1)])
    cumulative = np.concatenate([[0.0], np.cumsum(per_step)])
    return cumulative[np.asarray(steps, dtype=int)]


# ---------------------------------------------------------------------------------------------------- running
def run_verl(s: DemoSettings, prepared: Prepared, out: Path, spec: RunSpec,
             on_step: Callable[[int], None]) -> list[dict]:
    """Runs verl for one spec, from scratch or from an interrupted attempt's checkpoint, in this thread (so that an
    interrupt reaches run_trainer, which then stops every process of the run); returns its attempts."""
    folder, resume_from = resumable_run_dir(out, spec)
    stop = threading.Event()
    follower = threading.Thread(target=follow_steps, args=(folder / "metrics.jsonl", on_step, stop), daemon=True)
    follower.start()
    try:
        # a resumed run's start was validated by its first attempt
        run_method(s, spec.estimator, prepared, folder, own_start=resume_from is None, empty_first=False, n=spec.n,
                   batch=spec.batch, seed=spec.seed, extra=run_overrides(spec, prepared.priors),
                   checkpoint_every=s.test_freq, resume_from=resume_from)
    finally:
        stop.set()
        follower.join()
    return resume.finish_attempt(folder)


def run_one(s: DemoSettings, prepared: Prepared, out: Path, spec: RunSpec, key: dict[str, str],
            on_step: Callable[[int], None] = lambda step: None) -> dict:
    """Runs one spec (from scratch, or from an interrupted attempt's checkpoint; not at all when verl finished it and
    only its reading failed), reads it, saves and returns its result."""
    folder = run_dir(out, spec)
    if resume.completed(folder, s.steps):  # verl finished it; only reading it failed
        attempts = resume.read_attempts(folder)
        on_step(s.steps)
    else:
        attempts = run_verl(s, prepared, out, spec, on_step)
    record = report.read_run(spec.estimator, folder, prepared.question_family, in_format=s.in_format)
    if spec.estimator not in SIGNAL_DEFINED:
        record = replace(record, signal=pd.Series(dtype=float))
    resumed_from = [a["from_step"] for a in attempts[1:]]
    result = result_of(spec, key, record, sum(a["wall_s"] for a in attempts), folder / "rollouts", resumed_from)
    # when, and from which code: a comparison spans sessions and machines (issue 38)
    result |= {"started_utc": attempts[0]["started_utc"], "ended_utc": verl_ended_utc(attempts),
               "commit": code_commit()}
    peaks = [a["peak_memory_gib"] for a in attempts if "peak_memory_gib" in a]
    if peaks:  # what the next run of these settings needs (memory_needed), and what the docs quote
        result["peak_memory_gib"] = max(peaks)
    if resumed_from:
        result["resumed_from_steps"] = resumed_from
        result["attempt_cpus"] = [a.get("cpu", "unknown") for a in attempts]
    if spec.reads_priors:  # which file it read: the preparation's priors, made once (their hash ties them)
        result["priors_sha256"] = file_sha256(prepared.priors)
    save_result(out, spec, result)
    resume.drop_checkpoints(folder)
    return result
