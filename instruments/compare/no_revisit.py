"""verl's CPU comparison in the no-revisit regime (issue 29; results/regime.md; results/benchmarks.md, "No-revisit
regime").

The regime's arms (instruments/regime.py) as the comparison's arms (instruments/compare/arms.py, ARMS) at their group
sizes; the offline priors, made once in the comparison's shared preparation by the package's own path (``bv-blend
priors`` on the CPU harness, as ``scripts/offline_priors.py --cpu`` runs it) and recorded with the rollouts they
cost; and the summary of the finished runs that the rule reads (``InstrumentSummary`` "pretrained_lm",
results/regime/pretrained_lm.json; the tiny model's, "verl_cpu", is retired: results/verl_cpu/). The pool is the
``wide`` task's distinct problems (RunSettings ``task="wide"``, ``distinct_train=True``), read once by every arm, so
no prompt comes back; each run's visits per prompt are counted
in its rollout dump (``run_logs.visits_per_prompt``), not planned.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from instruments import regime
from instruments.compare import pairing
from instruments.compare.runs import file_sha256
from instruments.run import reward as demo_reward
from instruments.run import run_logs
from instruments.run.prepare import codebook_nmi
from instruments.run.settings import Prepared, RunSettings
from instruments.strict_json import strict_dumps

INSTRUMENT = "pretrained_lm"  # a pretrained LM's (issue 38): the rule's tie-breaker
# regime key -> the comparison's arm and group size (cluster level is BV-Blend's default history_level)
REGIME_ARMS: dict[str, tuple[str, int]] = {
    "grpo8": ("grpo", 8),
    "grpo2": ("grpo", 2),
    "rpp1": ("reinforce_plus_plus", 1),
    "bv_cluster1": ("bv_blend", 1),
    "bv_cluster2": ("bv_blend", 2),
    "bv_cluster8": ("bv_blend", 8),
    "spo1": ("spo", 1),
    "spo1_priors": ("spo_priors", 1),
    "bv2_priors": ("bv_blend_prompt_priors", 2),
    "grpo8_dynamic": ("grpo_dynamic", 8),
    "ha_dw8": ("ha_dw", 8),
    "maxnorm_rloo8": ("maxnorm_rloo", 8),
    "rpp1_ntf": ("reinforce_plus_plus_ntf", 1),
}
# The order of a seed's runs in the command: the reference first, then the arms the regime asks most about, so that an
# interrupted seed has them (seeds are outermost; a partial comparison is read on its whole seeds only)
# (the first design, on the retired tiny model: results/benchmarks.md; the pretrained LM's design adds verl's dynamic
# sampling and the companions: COMPANION_ARMS)
RUN_ORDER = ("grpo8", "rpp1", "bv_cluster2", "spo1", "grpo2", "bv_cluster1", "bv_cluster8", "spo1_priors", "bv2_priors")
COMPANION_ARMS = ("grpo8_dynamic", "ha_dw8", "maxnorm_rloo8", "rpp1_ntf")
NOT_ON_VERL = {
    "oracle_baseline1": "not run on verl: not required of this instrument (the labs run it); verl's trainer has no "
                        "true p of a prompt, and estimating it would take extra generation outside verl's loop",
    "knapsack_grpo2": "not run on verl: not required of this instrument (the labs run it); verl's GRPO runs every "
                      "prompt of a batch at one group size (actor_rollout_ref.rollout.n)",
}
PRIORS_SAMPLES = 8  # SPO's offline_N (results/regime.md, addendum)
PRIORS_FILE, PRIORS_RECORD = "priors.json", "priors_record.json"
PRIORS_TIMEOUT_S = 3600.0  # 1,920 x 8 responses: ~15-20 min on the 2-core machine (docs/priors.md's 43-56 ms each)
REVISITS_SOURCE = ("counted in each run's rollout dump (trainer.rollout_data_dir, rollouts/<step>.jsonl): a draw is "
                   "one sample of a step's batch (its uid's sample part), a prompt its text as verl sent it; max: the "
                   "largest visits of any prompt in any run, mean: the mean over runs of each run's mean visits per "
                   "drawn prompt")


def check_regime(arm_sizes: Sequence[tuple[str, int]], specs: Sequence[Any], steps: int, pool: int,
                 distinct_train: bool) -> None:
    """Refuses a comparison that claims the no-revisit regime (``--regime-summary``) and would revisit a prompt: the
    pool must hold distinct problems, at least steps x the largest batch of any arm; and the reference must run."""
    if REGIME_ARMS[regime.REFERENCE] not in arm_sizes:
        raise ValueError("--regime-summary pairs every arm with grpo:8, the regime's reference: add it to --arms")
    if not distinct_train:
        raise ValueError("--regime-summary is the no-revisit regime, and the pool may repeat a problem: add "
                         "--distinct-train (a pool of distinct problems), or drop --regime-summary")
    largest = max(spec.batch for spec in specs)
    if pool < steps * largest:
        raise ValueError(f"--regime-summary is the no-revisit regime, and a pool of {pool} prompts would be drawn "
                         f"again by the arm with {largest} prompts a step within {steps} steps ({steps * largest} "
                         "draws): raise --train-prompts to at least that, or drop it (its default is exactly that)")


def command_arms() -> list[str]:
    """The ``--arms`` of the regime's command, in :data:`RUN_ORDER`."""
    return [f"{arm}:{n}" for arm, n in (REGIME_ARMS[key] for key in RUN_ORDER)]


def regime_key(arm: str, n: int) -> str | None:
    """The regime's key of a comparison arm at group size ``n`` (None: not a regime arm)."""
    return next((key for key, value in REGIME_ARMS.items() if value == (arm, n)), None)


# ------------------------------------------------------------------------------------------------- the priors
def priors_overrides(prepared: Prepared, batch: int) -> list[str]:
    """The training runs' own settings that decide the priors' prompts and scores (docs/priors.md, "On CPU"): the
    preparation's training file, model and codebook, the demo's reward; ``bv-blend priors`` adds the
    validation-only ones (the rollouts' sampling, T=1, every training row)."""
    return [f"data.train_files={prepared.train}", f"actor_rollout_ref.model.path={prepared.model}",
            f"algorithm.bv_blend.codebook_path={prepared.codebook}", f"data.train_batch_size={batch}",
            *demo_reward.verl_overrides(last_number_answers=True)]  # the training runs' reward


def priors_command(out: Path, samples: int, overrides: Sequence[str]) -> str:
    """The documented command that does what :func:`prepare_priors` runs in-process."""
    return shlex.join(["python", "scripts/offline_priors.py", "--cpu", "--samples", str(samples), "--out", str(out),
                       *overrides])


def _generate(out: Path, samples: int, overrides: Sequence[str], timeout_s: float) -> None:
    """``bv-blend priors`` on the CPU harness, as scripts/offline_priors.py --cpu builds it (its Platform), in this
    process: an interrupt then reaches the CPU launcher, which stops every process of the generation run."""
    import argparse

    from bv_blend.cli import priors
    from bv_blend.cli.errors import CommandError
    from instruments.cpu import cpu_env
    from instruments.cpu.launch import DEFAULT_CPU_CONFIG, run_trainer
    from instruments.machine import describe_cpu

    parser = argparse.ArgumentParser(prog="offline_priors")
    priors.add_arguments(parser)
    args = priors.parse(parser, ["--config-name", DEFAULT_CPU_CONFIG, "--samples", str(samples), "--out", str(out),
                                 *overrides])
    try:
        priors.run(args, priors.Platform(describe_cpu(), run_trainer, cpu_env({}), timeout_s))
    except CommandError as error:  # the comparison's failed-run path: the other arms still run
        raise RuntimeError(f"the offline priors failed: {error}") from error


def prepare_priors(s: RunSettings, prepared: Prepared, batch: int, samples: int = PRIORS_SAMPLES,
                   timeout_s: float = PRIORS_TIMEOUT_S, generate: Any = _generate) -> tuple[Path, dict]:
    """The offline priors of every training prompt under the model, ``samples`` each, in ``s.work_dir``,
    and their record (the rollouts they cost, counted in the file; the command). Made once: a record made for this
    preparation whose file is unchanged is reused. ``generate(out, samples, overrides, timeout_s)`` writes the file."""
    out, record_path = s.work_dir / PRIORS_FILE, s.work_dir / PRIORS_RECORD
    overrides = priors_overrides(prepared, batch)
    key = {"preparation": s.preparation_key(), "samples": str(samples), "overrides": overrides}
    if record_path.is_file() and out.is_file():
        record = json.loads(record_path.read_text())
        if record["key"] == key and record["sha256"] == file_sha256(out):
            print(f"[compare] reusing the offline priors in {out} ({record['rollouts']} rollouts)")
            return out, record
    print(f"[compare] the offline priors: {samples} samples of each training prompt, verl's validation-only run")
    started = time.time()
    generate(out, samples, overrides, timeout_s)
    scores = json.loads(out.read_text())
    record = {"key": key, "file": str(out), "sha256": file_sha256(out), "samples": samples, "prompts": len(scores),
              "rollouts": sum(len(v) for v in scores.values()), "command": priors_command(out, samples, overrides),
              "wall_s": time.time() - started}
    tmp = record_path.with_suffix(".tmp")
    tmp.write_text(strict_dumps(record))
    os.replace(tmp, record_path)  # a generation cut short leaves no record: the next start makes the file again
    return out, record


def read_priors_record(work_dir: Path) -> dict | None:
    path = work_dir / PRIORS_RECORD
    return json.loads(path.read_text()) if path.is_file() else None


# ------------------------------------------------------------------------------------------------ the summary
def summarize(results: Sequence[dict], preparation: Mapping[str, Any], priors: Mapping[str, Any] | None,
              command: str, machine: str, missing: Sequence[str] = ()) -> regime.InstrumentSummary:
    """The regime's summary of the comparison's finished ``results`` (result.json, as compare_runs.save_result writes
    them), read on the seeds every arm has finished (paired), at the validation steps every run has.

    ``preparation``: the shared preparation's record (prepared.json); ``priors``: the priors' record (None without
    a priors arm). A priors arm's difference counts the priors' rollouts (``regime.final_with_priors``), and
    ``training_only`` does not. Raises ValueError when the reference has no result, a result has no counted visits,
    or a priors arm's result read another priors file than the record's.
    """
    by_arm: dict[str, dict[int, dict]] = {}
    for result in results:
        key = regime_key(result["spec"]["arm"], result["spec"]["n"])
        if key is not None:
            by_arm.setdefault(key, {})[result["spec"]["seed"]] = result
    if regime.REFERENCE not in by_arm:
        raise ValueError(f"no finished run of {REGIME_ARMS[regime.REFERENCE]}, the reference: nothing to pair with")
    seeds = pairing.common_seeds(by_arm.values())
    if not seeds:
        raise ValueError(f"no seed has finished every arm of {sorted(by_arm)}")
    used = [runs[seed] for runs in by_arm.values() for seed in seeds]
    steps = pairing.shared_steps(used)
    budgets = {r["spec"]["n"] * r["spec"]["batch"] for r in used}
    if len(budgets) != 1:
        raise ValueError(f"the arms spend different rollouts a step ({sorted(budgets)}): they cannot be paired")
    prior_rollouts = None if priors is None else int(priors["rollouts"])
    arms = {}
    for key in (k for k in regime.ARMS if k in by_arm):
        if regime.ARMS[key].generated:
            for seed in seeds:
                check_pool_not_exhausted(by_arm[key][seed])
        elif pairing.drew_beyond_batch([by_arm[key][seed] for seed in seeds]):
            # the reading follows the data (pairing.py), the pool check the declaration: they must agree
            raise ValueError(f"{key}'s runs logged verl's dynamic sampling (training/filter_groups/*), which its "
                             "regime arm does not declare (instruments/regime.py, RegimeArm.generated): a mislabelled "
                             "arm or an override that leaked into it")
        if regime.ARMS[key].priors:
            if priors is None:
                raise ValueError(f"{key} read offline priors, and no priors record was given: their rollouts must "
                                 "count")
            stale = [s for s in seeds if by_arm[key][s].get("priors_sha256") != priors["sha256"]]
            if stale:
                raise ValueError(f"{key}'s runs of seeds {stale} read another priors file than {priors['file']}")
        # the reading of benchmarks.md's differences table (pairing.py). A priors arm is placed after its priors: its
        # curve starts at the priors' rollouts (results/regime.md, addendum); its final, like the other instruments', is
        # the judged one (priors counted)
        paired = pairing.pair(by_arm[key], by_arm[regime.REFERENCE], seeds, steps)
        arms[key] = paired.reading(prior_rollouts if regime.ARMS[key].priors else None)
    revisits = _revisits(used)
    if revisits["max"] > 1:
        raise ValueError(f"a prompt was drawn {revisits['max']:g} times in one run: these runs are not the no-revisit "
                         "regime, whose summary this is (check_regime); report them without --regime-summary")
    return regime.InstrumentSummary(INSTRUMENT, command, machine, seeds, revisits, arms,
                                    notes=_notes(by_arm, seeds, used, steps, preparation, priors, missing))


def check_pool_not_exhausted(result: dict) -> None:
    """Raises ValueError where verl's dynamic sampling drew more prompts than the pool holds: its data loader then
    began the pool again, a revisit that the rollout dumps (the kept groups only) may not show."""
    spec, steps, pool = result["spec"], int(result["settings"]["steps"]), int(result["settings"]["n_train"])
    prompts = run_logs.generated_rollouts(result, [steps])[0] / spec["n"]  # the one reader of verl's drop counts
    if prompts > pool:
        raise ValueError(f"{spec['arm']}:{spec['n']} seed {spec['seed']} drew {prompts:.0f} prompts (kept and "
                         f"dropped) from a pool of {pool}: it revisited prompts. Enlarge the pool "
                         "(--train-prompts) for every arm and run the comparison again")


def _visits(result: dict) -> dict[str, float]:
    if "visits" not in result:
        raise ValueError(f"the result of {result['spec']['arm']}:{result['spec']['n']} seed {result['spec']['seed']} "
                         "has no visits counted from its rollout dump (made before the count existed): rerun it")
    return result["visits"]


def _revisits(used: Sequence[dict]) -> dict[str, float]:
    visits = [_visits(r) for r in used]
    return {"max": max(v["max"] for v in visits), "mean": float(np.mean([v["mean"] for v in visits]))}


def _notes(by_arm: Mapping[str, Mapping[int, dict]], seeds: Sequence[int], used: Sequence[dict], steps: Sequence[int],
           preparation: Mapping[str, Any], priors: Mapping[str, Any] | None, missing: Sequence[str]) -> dict:
    nmi = preparation.get("codebook_nmi")
    if nmi is None:  # a preparation made before its record held it: from its annotated training file
        nmi = codebook_nmi(Path(preparation["train"]))
    by_arm_visits = {}
    for key, runs in by_arm.items():
        visits = [_visits(runs[s]) for s in seeds]
        planned = [runs[s]["summary"].get("advisor/visits_per_prompt") for s in seeds]
        by_arm_visits[key] = {"max": max(v["max"] for v in visits), "mean": float(np.mean([v["mean"] for v in visits])),
                              "prompts drawn a run": float(np.mean([v["prompts"] for v in visits])),
                              **({"advisor/visits_per_prompt (planned)": planned[0]} if None not in planned else {})}
    left_out = sorted(f"{key} seed {s}" for key, runs in by_arm.items() for s in runs if s not in seeds)
    return {
        "arms": {key: f"{REGIME_ARMS[key][0]}:{REGIME_ARMS[key][1]}" for key in by_arm},
        "settings": used[0]["settings"],
        "validation steps": list(steps),
        "codebook": {"nmi vs task families": float(nmi), "num_clusters": preparation["key"]["num_clusters"],
                     "how": "bv_blend.codebook (all-MiniLM-L6-v2 + K-means) on the training prompts' text; "
                            "sklearn normalized_mutual_info_score against the rows' families"},
        "revisits measured": REVISITS_SOURCE,
        "revisits by arm": by_arm_visits,
        "priors": None if priors is None else {
            k: priors[k] for k in ("rollouts", "samples", "prompts", "sha256", "command", "wall_s")},
        "priors counted": "difference: the priors' rollouts counted in the budget (regime.final_with_priors); "
                          "training_only: the training rollouts only; reach: the curve placed after the priors",
        "not run on verl": dict(NOT_ON_VERL),
        "runs left out (seed incomplete)": left_out,
        "runs not finished": list(missing),
        "warm-up pass rates": preparation.get("warmup_pass_rates", {}),
    }
