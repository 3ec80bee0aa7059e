"""The token lab's no-revisit regime (issue 29): its summary for the rule, the learning-rate check's arms, and its
report (results/token_lab/token_lab.md).

Every number the rule reads comes from ``summary``: per arm the final held-out pass rate, the paired difference to
GRPO n = 8 (an arm with priors: its priors' rollouts counted, instruments.regime.final_with_priors; and once more
without them), the rollouts-to-reach ratio, the verdict (instruments/rule.py). The learning-rate check runs
REINFORCE++ n = 1 and the package's best arm (rule.best_package_arm) beside the reference.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from instruments import regime, rule, stats
from instruments.lab.token import assets, plots
from instruments.lab.token.arms import PRIORS_TWINS
from instruments.lab.token.runner import SuiteResults
from instruments.lab.token.store import Store
from instruments.lab.token.suites import LR_SWEEP_FACTORS
from instruments.stats import format_interval, format_reach

REFERENCE = regime.REFERENCE
# Paired contrasts the report prints beside the rule's reading (they judge nothing): the package's arm against
# the history-free batch baseline, BV-Blend's group sizes, and each limit against its own base.
CONTRASTS = (("bv_cluster2", "rpp1"), ("bv_cluster1", "rpp1"), ("bv_cluster2", "bv_cluster8"),
             ("oracle_baseline1", "rpp1"), ("knapsack_grpo2", "grpo2"), ("knapsack_grpo2", "rpp1"))


def prior_rollouts(results: SuiteResults) -> int:
    settings = results.suite.settings
    return settings.prior_samples * settings.pool_size


def _curves(results: SuiteResults, key: str, lr: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    runs = results.runs(key, lr)
    return np.array(runs[0].eval_steps) * results.suite.settings.budget, np.array([r.pass_rate for r in runs])


def arm_summary(results: SuiteResults, key: str, lr: float | None = None) -> regime.ArmSummary:
    """One arm at one learning rate against the reference at the same learning rate, paired by seed."""
    x_ref, ref = _curves(results, REFERENCE, lr)
    x, curves = _curves(results, key, lr)
    paid = prior_rollouts(results) if results.suite.table[key].priors else None
    return regime.arm_summary(curves, x, ref, x_ref, paid)


def complete(results: SuiteResults, lr: float | None = None) -> list[str]:
    return [key for key in results.suite.arms if results.complete(key, lr)]


def lr_check_keys(results: SuiteResults) -> list[str]:
    """The reference, REINFORCE++ n = 1 and the package's best arm (every package arm's x1 runs must be done)."""
    missing = [key for key in (*regime.PACKAGE, REFERENCE) if not results.complete(key)]
    if missing:
        raise ValueError(f"the learning-rate check needs the x1 runs of {sorted(missing)} finished first")
    differences = {key: arm_summary(results, key).difference for key in regime.PACKAGE}
    best = rule.best_package_arm(differences, regime.PACKAGE)
    return list(dict.fromkeys([REFERENCE, regime.HEADROOM_BASE, best]))


def revisits(results: SuiteResults) -> dict[str, float]:
    """Visits of each drawn prompt over every finished x1 run, measured from the runs' own counts."""
    visits = np.concatenate([np.array(r.visits) for key in complete(results) for r in results.runs(key)])
    drawn = visits[visits > 0]
    return {"max": int(visits.max()), "mean": float(drawn.mean()), "prompts_drawn_per_run_max": int(
        max((np.array(r.visits) > 0).sum() for key in complete(results) for r in results.runs(key)))}


def spo_equals_reinforce_pp(results: SuiteResults) -> dict[str, object]:
    """Whether SPO n = 1 trained exactly as REINFORCE++ n = 1 (same seed: same prompts and sampling stream)."""
    if not (results.complete("spo1") and results.complete("rpp1")):
        return {"checked": False}
    pairs = list(zip(results.runs("spo1"), results.runs("rpp1"), strict=True))
    same = [a.pass_rate == b.pass_rate and a.reward == b.reward for a, b in pairs]
    # the first step whose mean reward differs: the runs sample alike until their updates have parted
    parted = [next((i + 1 for i, (x, y) in enumerate(zip(a.reward, b.reward, strict=True)) if x != y), None)
              for a, b in pairs]
    difference = stats.paired_difference(np.array([a.pass_rate[-1] for a, _ in pairs]),
                                         np.array([b.pass_rate[-1] for _, b in pairs]))
    return {"checked": True, "identical_seeds": int(sum(same)), "seeds": len(same), "first_differing_step": parted,
            "final_difference": [difference.value, difference.low, difference.high]}


def priors_contrast(results: SuiteResults) -> dict[str, dict[str, object]]:
    """What the priors bought: each finished priors arm minus its twin without priors (arms.PRIORS_TWINS), final
    held-out pass rate, training rollouts only, paired by seed. The judged figure counts the priors' rollouts; where
    they are at least a run's training rollouts it is each seed's start value, the same for every priors arm
    (``counted_final_is_start``): arithmetic, not a measurement."""
    settings = results.suite.settings
    counted_is_start = prior_rollouts(results) >= settings.steps * settings.budget
    found: dict[str, dict[str, object]] = {}
    for key, twin in PRIORS_TWINS.items():
        if key not in results.suite.arms or not (results.complete(key) and results.complete(twin)):
            continue
        runs, twins = results.runs(key), results.runs(twin)
        if [r.seed for r in runs] != [r.seed for r in twins]:
            raise ValueError(f"{key} and {twin} ran other seeds: their difference is paired by seed")
        difference = stats.paired_difference(np.array([r.pass_rate[-1] for r in runs]),
                                             np.array([r.pass_rate[-1] for r in twins]))
        found[key] = {"twin": twin, "training_only_minus_twin": [difference.value, difference.low, difference.high],
                      "counted_final_is_start": counted_is_start}
    return found


def dropped(results: SuiteResults) -> dict[str, dict[str, str]]:
    """Every arm of the suite missing from the summary's arms, with why (an arm left out says so in the committed
    summary, not only in a log): unavailable (its probe's error), not run (a derived arm), failed runs (the error's
    last line, by result file), or unfinished."""
    finished = set(complete(results))
    failed = {name: error.strip().splitlines()[-1] if error.strip() else "" for name, error in results.failures.items()}
    unfinished = {key: "its runs are not all finished" for key in results.suite.arms
                  if key not in finished and key not in results.unavailable and key not in results.pending}
    return {"unavailable": dict(results.unavailable), "not_run": dict(results.pending), "failed_runs": failed,
            "unfinished": unfinished}


def summary(results: SuiteResults, out: Path, command: str, machine: str) -> regime.InstrumentSummary:
    """The instrument's summary (instruments/regime.py) from the suite's folder ``out``."""
    suite = results.suite
    arms = {key: arm_summary(results, key) for key in complete(results)}
    lr_check = {}
    for key in (k for k in results.lr_sweep_arms if k != REFERENCE):
        for factor in LR_SWEEP_FACTORS:
            lr = suite.lr * factor
            if results.complete(key, lr) and results.complete(REFERENCE, lr):
                lr_check.setdefault(key, {})[f"x{factor:g}"] = arm_summary(results, key, lr).difference
    notes: dict[str, object] = {"prior_rollouts": prior_rollouts(results), "pool": suite.settings.pool_size,
                                "spo1_vs_rpp1": spo_equals_reinforce_pp(results), **dropped(results),
                                "priors_minus_twin": priors_contrast(results)}
    clusters = assets.clusters_path(suite.settings, Store(out).cache)
    if clusters.is_file():
        saved = json.loads(clusters.read_text())
        notes["codebook"] = {k: saved[k] for k in ("num_clusters", "nmi_vs_families", "sizes", "encoder")}
    return regime.InstrumentSummary("token_lab", command, machine, list(suite.seeds), revisits(results), arms,
                                    lr_check, notes)


def report_lines(results: SuiteResults, found: regime.InstrumentSummary, path: Path) -> list[str]:
    """The regime's tables and plots, for results/token_lab/token_lab.md."""
    lines = [*priors_lines(results, found), "## Arms: the rule's reading (instruments/rule.py)", "",
             "Final held-out pass rate (seed mean, 95% t-interval); the paired difference to GRPO n=8 (arm minus "
             "reference, 95% t-interval over paired seeds, the revised rule's) and its verdict; rollouts to reach "
             "the reference's final value (x the reference's; judges nothing). Priors arms: judged with their "
             f"{prior_rollouts(results):,} offline rollouts counted; 'training only' leaves them out."
             + (" Counted, their final is each seed's start value (see *What the priors bought*): arithmetic, not a "
                "measurement." if _counted_is_start(results) else ""), "",
             "| arm | final | difference to GRPO n=8 | verdict | training only | rollouts to reach |",
             "|---|---|---|---|---|---|"]
    for key, arm in found.arms.items():
        difference = "ref" if key == REFERENCE else format_interval(arm.difference, signed=True)
        verdict = "" if key == REFERENCE else arm.verdict
        only = format_interval(arm.training_only, signed=True) if arm.training_only is not None else ""
        if arm.training_only is not None and _counted_is_start(results):
            difference += " (counted: the start value, arithmetic)"
        lines.append(f"| {results.suite.table[key].label} | {format_interval(arm.final)} | {difference} | {verdict} | "
                     f"{only} | {format_reach(arm.reach)} |")
    base = found.arms.get(regime.HEADROOM_BASE)
    if base is not None:
        lines += ["", f"How far each limit is from {regime.ARMS[regime.HEADROOM_BASE].label} (rule.headroom: the "
                  "limit's difference minus REINFORCE++'s, in held-out pass rate):", ""]
        for key in sorted(regime.LIMITS & set(found.arms)):
            lead = rule.headroom(found.arms[key].difference, base.difference)
            lines.append(f"- {results.suite.table[key].label}: {lead:+.3f}")
    finals = {key: np.array([r.pass_rate[-1] for r in results.runs(key)]) for key in found.arms}
    pairs = [(a, b) for a, b in CONTRASTS if a in finals and b in finals]
    if pairs:
        lines += ["", "Paired contrasts (final held-out pass rate, first minus second, 95% paired t-interval; they "
                  "judge nothing):", ""]
        for a, b in pairs:
            contrast = stats.paired_difference(finals[a], finals[b])
            lines.append(f"- {results.suite.table[a].label} minus {results.suite.table[b].label}: "
                         f"{format_interval(contrast, signed=True)}")
    if found.lr_check:
        lines += ["", "## Learning-rate check (x0.5, x2; each arm against GRPO n=8 at the same learning rate)", "",
                  "| arm | x0.5 | x1 | x2 |", "|---|---|---|---|"]
        for key, by_factor in found.lr_check.items():
            x1 = found.arms[key].difference if key in found.arms else None
            cells = [format_interval(by_factor.get("x0.5"), signed=True), format_interval(x1, signed=True),
                     format_interval(by_factor.get("x2"), signed=True)]
            lines.append(f"| {results.suite.table[key].label} | " + " | ".join(cells) + " |")
    series = {results.suite.table[key].label: (np.array(results.runs(key)[0].eval_steps),
                                               np.array([r.pass_rate for r in results.runs(key)]))
              for key in found.arms}
    target = float(np.mean([r.pass_rate[-1] for r in results.runs(REFERENCE)])) if REFERENCE in found.arms else None
    figure = plots.curves(series, results.suite.settings.budget, path.with_name(f"{path.stem}_curves.png"),
                          "No-revisit regime: held-out pass rate (95% bands over seeds)", target)
    lines += ["", f"![curves]({figure.name})", ""]
    return lines


def _counted_is_start(results: SuiteResults) -> bool:
    settings = results.suite.settings
    return prior_rollouts(results) >= settings.steps * settings.budget


def priors_lines(results: SuiteResults, found: regime.InstrumentSummary) -> list[str]:
    """The report's priors section: the informative contrast first (each priors arm minus its twin, training
    rollouts only), then what the counted figure is."""
    contrasts = found.notes.get("priors_minus_twin", {})
    if not contrasts:
        return []
    settings, table = results.suite.settings, results.suite.table
    times = prior_rollouts(results) / (settings.steps * settings.budget)
    lines = ["## What the priors bought", "",
             "Each priors arm minus its twin without priors, final held-out pass rate, training rollouts only, "
             "paired by seed (95% paired t-interval):", ""]
    for key, contrast in contrasts.items():
        value, low, high = contrast["training_only_minus_twin"]
        lines.append(f"- {table[key].label} minus {table[contrast['twin']].label}: "
                     f"{format_interval(stats.Interval(value, low, high), signed=True)}")
    lines += ["", f"The priors are {prior_rollouts(results):,} rollouts ({settings.prior_samples} a pool prompt), "
              f"{times:.1f}x a whole run's training rollouts. They are a one-off cost: a user generates them once "
              "for a dataset and an initial policy and reuses them across runs, so their price per run falls with "
              "each run that reuses them."]
    if _counted_is_start(results):
        lines += ["", "Counted in the budget, as the rule judges them, a priors arm has not trained at all by the "
                  "reference's final rollouts: its counted final is each seed's start value, the same number for "
                  "every priors arm. That counted difference to GRPO n=8 (in the table below) is arithmetic, not a "
                  "measurement of the priors."]
    return [*lines, ""]


def write(results: SuiteResults, info: object, out: Path, path: Path) -> Path:
    """The report at ``path`` (with its plot beside it) and the summary results/regime/token_lab.json."""
    command = getattr(info, "command", "")
    machine = getattr(info, "machine", "")
    found = summary(results, out, command, machine)
    regime.write_summary(found, path.parent)
    settings = results.suite.settings
    notes = found.notes
    codebook = notes.get("codebook", {})
    pending = [key for key in results.suite.arms if key not in found.arms]
    lines = [
        "# Token lab: the no-revisit regime (issue 29)", "",
        f"Last command: `{command}` ({getattr(info, 'date', '')}), "
        f"{getattr(info, 'wall_seconds', 0.0) / 60:.1f} min wall with {getattr(info, 'jobs', '?')} worker "
        f"process(es). Machine: `{machine}`. Judged by the one rule of results/regime.md (instruments/rule.py) as "
        "revised in `9befa39`. The regime and the rule's first version (`59fdb98`, addendum `9f6e701`) were committed "
        "before any run of this regime; the revision came after its first run, so this is a reading after the fact.",
        "",
        "## What this regime is", "",
        f"- **Task**: the widened task (instruments/demo/task.py `WIDE_FAMILIES`): the demo's five kinds and wordings "
        "with wider operands, so that 1,024 distinct problems a family fit in the pool; the held-out split "
        f"({settings.val_prompts} prompts) is drawn from the same task and is disjoint from the pool.",
        f"- **Pool**: {settings.pool_size:,} distinct problems, walked in one seeded permutation: "
        f"measured visits per drawn prompt: max {found.revisits['max']}, mean {found.revisits['mean']:.2f} "
        f"(over every finished run; the most prompts one run drew: {found.revisits['prompts_drawn_per_run_max']:,}).",
        f"- **Clusters**: the package's codebook (`{codebook.get('encoder', 'MiniLM')}`, K-means, "
        f"K = {codebook.get('num_clusters', settings.num_clusters)}) fitted on the pool's prompt text; NMI against "
        f"the families {codebook.get('nmi_vs_families', float('nan')):.2f}; cluster sizes {codebook.get('sizes')}.",
        f"- **Settings**: the token lab's frozen ones (instruments/lab/token/frozen.json: lr {results.suite.lr:g}, "
        f"{settings.steps} steps), {settings.budget} rollouts a step for every arm, seeds "
        f"{results.suite.seeds[0]}-{results.suite.seeds[-1]}, warm-up {settings.warmup_steps} steps, held-out "
        f"evaluated every {settings.eval_every} steps with {settings.eval_samples} samples a prompt.",
        f"- **Priors**: {settings.prior_samples} scores a pool prompt from the initial policy = "
        f"{notes['prior_rollouts']:,} rollouts, {notes['prior_rollouts'] / (settings.steps * settings.budget):.1f}x "
        "a whole run's training rollouts.",
        f"- **Limits**: not an oracle: p^ is a {settings.oracle_samples}-sample estimate of the current policy's p "
        f"({settings.oracle_samples} extra responses a prompt at T = 1, not counted as rollouts). The Knapsack "
        "allocation gives a prompt 0 or 2-16 rollouts, and 0 to every prompt whose samples all agree (p^ = 0 or 1), "
        "so both limits understate what the true p would give.", "",
    ]
    spo = notes["spo1_vs_rpp1"]
    if spo.get("checked"):
        value, low, high = spo["final_difference"]
        lines += [f"**SPO n=1 and REINFORCE++ n=1**: identical training (the same held-out curve and step rewards) in "
                  f"{spo['identical_seeds']} of {spo['seeds']} seeds; the first step whose rollouts' mean reward "
                  f"differs, by seed: {spo['first_differing_step']}. Final held-out pass rate, SPO minus REINFORCE++ "
                  f"(paired): {value:+.3f} [{low:+.3f}, {high:+.3f}].", ""]
    if pending:
        lines += ["**Not in the tables** (the summary's notes say the same):", ""]
        for key in pending:
            why = next((notes[kind][key] for kind in ("unavailable", "not_run", "unfinished") if key in notes[kind]),
                       "no finished runs")
            lines.append(f"- {results.suite.table[key].label}: {why}")
        lines.append("")
    if notes["failed_runs"]:
        lines += [f"**Failed runs** ({len(notes['failed_runs'])}, tried again by the next run of the command): "
                  + "; ".join(f"{name}: {error}" for name, error in notes["failed_runs"].items()), ""]
    lines += report_lines(results, found, path)
    path.write_text("\n".join(lines) + "\n")
    return path
