"""The no-revisit regime's arms, declared once for every instrument, and the summary each instrument writes.

Each instrument (the pretrained LM on verl's CPU trainer, the logistic lab) runs these arms in its own way and writes
one JSON summary (``write_summary``) of what the rule (instruments/rule.py) reads: per arm the paired final difference
to GRPO n = 8 with its 95% t-interval, the verdict and the per-seed finals. ``scripts/regime_report.py`` reads every
summary and applies the rule (``recommend``; results/regime.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from instruments import rule, stats
from instruments.stats import Interval
from instruments.strict_json import finite_or, strict_dumps

SUMMARY_DIR = Path(__file__).resolve().parents[1] / "results" / "regime"
# The instruments whose summaries (SUMMARY_DIR/<name>.json) the rule reads; other files there (the pretrained LM's
# settings, reports) are not summaries. The pretrained LM first: it breaks the rule's ties (rule.TIE_BREAKERS), and a
# user's run is most like it. Retired, their summaries kept with their run record and no longer read: the token lab
# (results/token_lab/) and the tiny model on verl's CPU trainer (results/verl_cpu/).
INSTRUMENTS = ("pretrained_lm", "logistic_lab")
REFERENCE = "grpo8"


# What an arm needs beyond verl, simplest first: the rule recommends the simplest of a tied set (rule.recommend).
NEEDS = ("verl", "package", "codebook", "priors")


@dataclass(frozen=True)
class RegimeArm:
    key: str
    label: str
    n: int  # rollouts per prompt (the estimated-p allocation: on average)
    package: bool = False  # runs one of the package's estimators (BV-Blend, SPO): a candidate "best arm"
    limit: bool = False  # reads p (true in the logistic lab, estimated from extra samples elsewhere): never recommended
    priors: bool = False  # paid for in offline rollouts: judged with them counted
    needs: str = "verl"  # one of NEEDS: verl's stock trainer alone, this package, a codebook, offline priors
    in_labs: bool = True  # the labs run it too (dynamic sampling and a token-level loss exist in verl's trainer alone)
    twin: str | None = None  # a priors arm: the same arm without priors, whose difference is what the priors bought
    generated: bool = False  # draws beyond its batch (dynamic sampling): judged at the rollouts it generated


ARMS: dict[str, RegimeArm] = {arm.key: arm for arm in (
    RegimeArm(REFERENCE, "GRPO n=8 (reference)", 8),
    RegimeArm("grpo2", "GRPO n=2", 2),
    RegimeArm("rpp1", "REINFORCE++ n=1", 1),
    RegimeArm("bv_cluster1", "BV-Blend cluster level n=1", 1, package=True, needs="codebook"),
    RegimeArm("bv_cluster2", "BV-Blend cluster level n=2", 2, package=True, needs="codebook"),
    RegimeArm("bv_cluster8", "BV-Blend cluster level n=8", 8, package=True, needs="codebook"),
    RegimeArm("spo1", "SPO n=1", 1, package=True, needs="package"),
    RegimeArm("spo1_priors", "SPO n=1 + offline priors", 1, package=True, priors=True, needs="priors", twin="spo1"),
    # its twin is the cluster level: with no prompt coming back, its prompt history without priors never holds
    # anything, so prompt_and_cluster without priors is the cluster level
    RegimeArm("bv2_priors", "BV-Blend prompt_and_cluster n=2 + offline priors", 2, package=True, priors=True,
              needs="priors", twin="bv_cluster2"),
    # The pretrained-LM comparison's arms beside those (issue 38): verl's own answer to zero-variance groups, and
    # the seeds' companions (docs/companions.md).
    RegimeArm("grpo8_dynamic", "GRPO n=8 + DAPO dynamic sampling (every generated rollout counted)", 8, in_labs=False,
              generated=True),
    RegimeArm("ha_dw8", "HA-DW n=8", 8, needs="package", in_labs=False),
    RegimeArm("maxnorm_rloo8", "MaxNorm-AC with RLOO n=8", 8, needs="package", in_labs=False),
    RegimeArm("rpp1_ntf", "REINFORCE++ n=1 + negative token filtering", 1, needs="package", in_labs=False),
    RegimeArm("oracle_baseline1", "limit: baseline R - p, n=1 (p true in the logistic lab)", 1, limit=True),
    RegimeArm("knapsack_grpo2", "limit: allocation by p (Knapsack) + GRPO, 2 a prompt on average (p true in the "
              "logistic lab)", 2, limit=True),
)}
LIMITS = frozenset(key for key, arm in ARMS.items() if arm.limit)
PACKAGE = frozenset(key for key, arm in ARMS.items() if arm.package)
SIMPLICITY = {key: NEEDS.index(arm.needs) for key, arm in ARMS.items()}
IN_LABS = {key: arm for key, arm in ARMS.items() if arm.in_labs}  # what the logistic lab runs
PRIORS_TWINS = {key: arm.twin for key, arm in ARMS.items() if arm.twin is not None}
HEADROOM_BASE = "rpp1"


@dataclass
class ArmSummary:
    final: Interval  # seed-mean final held-out pass rate (a priors arm: with its priors counted, as judged)
    difference: Interval  # paired, minus the reference; priors counted for a priors arm
    reach: Interval  # rollouts to reach the reference's final value, x the reference's (judges nothing)
    verdict: str = ""
    training_only: Interval | None = None  # a priors arm: the difference counting training rollouts only
    finals: list[float] | None = None  # per seed, in the summary's seed order, as judged (what separates two arms)

    def __post_init__(self) -> None:
        self.verdict = rule.verdict(self.difference)


@dataclass
class InstrumentSummary:
    instrument: str  # one of INSTRUMENTS: "pretrained_lm" or "logistic_lab"
    command: str
    machine: str
    seeds: list[int]
    revisits: dict[str, float]  # the measured visits per prompt: "max" and "mean" over the run's drawn prompts
    arms: dict[str, ArmSummary]
    lr_check: dict[str, dict[str, Interval]] = field(default_factory=dict)  # arm -> "x0.5"/"x2" -> difference
    notes: dict[str, Any] = field(default_factory=dict)  # e.g. the clusters' NMI, the priors' rollouts

    def __post_init__(self) -> None:
        unknown = sorted(set(self.arms) - set(ARMS))
        if unknown:
            raise ValueError(f"{self.instrument}: arms {unknown} are not regime arms ({', '.join(ARMS)})")


def arm_summary(curves: Any, x: Any, reference: Any, x_reference: Any,
                prior_rollouts: int | None = None) -> ArmSummary:
    """One arm's reading, from its (seeds, points) held-out curves over rollouts ``x`` and the reference's, paired by
    seed (row). With ``prior_rollouts`` (a priors arm) the judged final and difference count them in the budget
    (:func:`final_with_priors`), its curve is placed after them for the reach, and ``training_only`` leaves them out."""
    import numpy as np

    curves, reference = np.asarray(curves, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    x, x_reference = np.asarray(x, dtype=np.float64), np.asarray(x_reference, dtype=np.float64)
    final = curves[:, -1]
    if prior_rollouts is None:
        return ArmSummary(stats.mean_interval(final), stats.paired_difference(final, reference[:, -1]),
                          stats.reach_interval(curves, reference, x, x_reference), finals=final.tolist())
    counted = final_with_priors(curves, x, prior_rollouts)
    return ArmSummary(stats.mean_interval(counted), stats.paired_difference(counted, reference[:, -1]),
                      stats.reach_interval(curves, reference, x + prior_rollouts, x_reference),
                      training_only=stats.paired_difference(final, reference[:, -1]), finals=counted.tolist())


def generated_arm_summary(curves: Any, x_by_seed: Any, reference: Any, x_reference: Any) -> ArmSummary:
    """An arm that generates more rollouts than its batch (verl's dynamic sampling), read at the reference's final
    rollouts: each seed's curve is placed on its own cumulative generated rollouts ``x_by_seed`` (seeds, points) and
    read there, linearly between validations (results/regime.md, the pretrained-LM comparison). Its reach is read on
    the seeds' mean rollouts (it judges nothing)."""
    import numpy as np

    curves, reference = np.asarray(curves, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    x_by_seed, x_reference = np.asarray(x_by_seed, dtype=np.float64), np.asarray(x_reference, dtype=np.float64)
    budget = x_reference[-1]
    if (x_by_seed[:, -1] < budget).any():
        raise ValueError(f"a run generated fewer rollouts ({x_by_seed[:, -1].min():g}) than the reference's budget "
                         f"({budget:g}): it cannot be read at that budget")
    finals = np.array([np.interp(budget, x, curve) for x, curve in zip(x_by_seed, curves, strict=True)])
    return ArmSummary(stats.mean_interval(finals), stats.paired_difference(finals, reference[:, -1]),
                      stats.reach_interval(curves, reference, x_by_seed.mean(0), x_reference), finals=finals.tolist())


def write_summary(summary: InstrumentSummary, directory: Path = SUMMARY_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{summary.instrument}.json"
    path.write_text(strict_dumps(asdict(summary)) + "\n")  # a reach never made (inf) is written as null
    return path


def read_summaries(directory: Path = SUMMARY_DIR) -> dict[str, InstrumentSummary]:
    """instrument -> its summary, for each of ``INSTRUMENTS`` with a file in ``directory``, in that order."""
    return {name: read_summary(directory / f"{name}.json") for name in INSTRUMENTS
            if (directory / f"{name}.json").is_file()}


def read_summary(path: Path) -> InstrumentSummary:
    data = json.loads(path.read_text())
    interval = lambda v: None if v is None else Interval(**v)  # noqa: E731
    # a null bound of rollouts-to-reach is a target never reached within the run: infinitely many rollouts
    reach = lambda v: None if v is None else Interval(**{k: finite_or(x, math.inf) for k, x in v.items()})  # noqa: E731
    arms = {key: ArmSummary(interval(a["final"]), interval(a["difference"]), reach(a["reach"]),
                            training_only=interval(a.get("training_only")), finals=a.get("finals"))
            for key, a in data["arms"].items()}
    lr_check = {key: {factor: interval(v) for factor, v in by.items()} for key, by in data.get("lr_check", {}).items()}
    return InstrumentSummary(data["instrument"], data["command"], data["machine"], data["seeds"], data["revisits"],
                             arms, lr_check, data.get("notes", {}))


def differences(summaries: Mapping[str, InstrumentSummary]) -> dict[str, dict[str, Interval]]:
    """arm -> instrument -> difference, what ``rule.recommend`` reads."""
    out: dict[str, dict[str, Interval]] = {}
    for name, summary in summaries.items():
        for key, arm in summary.arms.items():
            if key != REFERENCE:
                out.setdefault(key, {})[name] = arm.difference
    return out


def finals(summaries: Mapping[str, InstrumentSummary]) -> dict[str, dict[str, list[float]]]:
    """arm -> instrument -> per-seed finals (where the summary records them): what separates two qualified arms."""
    out: dict[str, dict[str, list[float]]] = {}
    for name, summary in summaries.items():
        for key, arm in summary.arms.items():
            if arm.finals is not None:
                out.setdefault(key, {})[name] = arm.finals
    return out


def recommend(summaries: Mapping[str, InstrumentSummary]) -> rule.Recommendation:
    """The rule over the judged instruments' summaries (those with at least ``rule.MIN_SEEDS`` seeds)."""
    judged = {name: summary for name, summary in summaries.items() if len(summary.seeds) >= rule.MIN_SEEDS}
    return rule.recommend(differences(judged), LIMITS, finals(judged), SIMPLICITY)


def final_with_priors(curves: Any, x: Any, prior_rollouts: int) -> Any:
    """Each seed's pass rate at the budget's end when ``prior_rollouts`` offline rollouts are counted in it.

    ``curves`` (seeds, points) over rollouts ``x`` (the arm's training rollouts at each evaluation, from 0): the run
    is placed after its priors, so at the reference's final rollouts x[-1] it has trained x[-1] - prior_rollouts;
    before its first step (a negative training budget) it reads its start value (np.interp holds the end values).
    """
    import numpy as np

    curves, x = np.asarray(curves, dtype=np.float64), np.asarray(x, dtype=np.float64)
    at = x[-1] - prior_rollouts
    return np.array([np.interp(at, x, curve) for curve in curves])
