"""The multi-seed comparison behind scripts/compare_cpu.py: named arms (a verl estimator, its overrides, a group size),
several seeds, on verl's stock trainer on CPU, each run validated on the demo's held-out prompts; tables, a plot,
results/benchmarks.md (the tables, plot and doc section: instruments.demo.compare_report).

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
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from instruments.demo import report, resume
from instruments.demo.pipeline import DemoSettings, Prepared
from instruments.demo.run_logs import SIGNAL_DEFINED, extra_summary, filter_groups_of, visits_per_prompt
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
    # the no-revisit regime's arms with offline priors (results/regime.md, addendum): the only history they can have
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


def verl_ended_utc(attempts: Sequence[dict]) -> str:
    """When verl's last attempt ended (a run read again after a reader's failure ended then, not at its reading)."""
    last = attempts[-1]
    return datetime.fromtimestamp(last["started_unix"] + last["wall_s"], timezone.utc).isoformat(timespec="seconds")


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
