"""results/lab/regime.md and its plot, from the regime suite's summary (``instruments.lab.regime_suite``) and runs."""

from __future__ import annotations

from pathlib import Path

from instruments import regime, stats
from instruments.lab.regime import KNAPSACK_HIGH, KNAPSACK_LOW
from instruments.lab.regime_suite import FACTORS, SuiteRuns, lr_arms
from instruments.rule import verdict
from instruments.stats import format_interval, format_reach

DPI = 80
PLOT = "regime_curves.png"


def write_report(summary: regime.InstrumentSummary, suite: SuiteRuns, out: Path, wall_minutes: float,
                 rule_commit: str) -> Path:  # fmt: skip
    """Write ``out/regime.md`` and ``out/regime_curves.png``; returns the markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    _plot(summary, suite, out / PLOT)
    notes, pool = summary.notes, summary.notes["pool"]
    held_out = pool["clusters"] * pool["held_out_per_cluster"]
    nmi = min(notes["codebook"]["nmi_per_seed"]), max(notes["codebook"]["nmi_per_seed"])
    priors, codebook, knapsack = notes["priors"], notes["codebook"], notes["knapsack"]
    reference = summary.arms[regime.REFERENCE]
    lines = [
        "# The logistic lab where no prompt comes back (issue 29)",
        "",
        f"Written by `{summary.command}` ({wall_minutes:.1f} min wall, {_ran(suite)}). "
        f"Machine: {summary.machine}. The plan and the rule: [results/regime.md](../regime.md) "
        f"(its last commit when this was written: `{rule_commit}`), [instruments/rule.py](../../instruments/rule.py); "
        f"the summary the rule reads: [results/regime/logistic_lab.json](../regime/logistic_lab.json). The lab: "
        "[results/lab.md](../lab.md), section 5.",
        "",
        "## Setting",
        "",
        "| setting | value |",
        "|---|---|",
        f"| pool | {pool['prompts']:,} training prompts ({pool['clusters']} clusters x {pool['per_cluster']:,}), "
        f"walked in one seeded permutation per seed, the same for every arm; {pool['steps']} steps x "
        f"{pool['rollouts_per_step']} prompts at n = 1 use all of it |",
        f"| held-out | {pool['held_out_per_cluster']} prompts a cluster ({held_out:,}), the same difficulty model, "
        "never drawn; the judged quantity is their expected success (the true p) |",
        f"| optimizer, budget | Adam lr {pool['lr']}, clip 1.0 (the lab's frozen base); {pool['rollouts_per_step']} "
        f"rollouts a step; {pool['steps']} steps; seeds {summary.seeds[0]}..{summary.seeds[-1]}, paired |",
        f"| codebook (cluster-history arms) | noisy: a share q = {codebook['share']} of the prompts in a random "
        f"cluster, q calibrated on the labels alone to NMI {codebook['target_nmi']}; measured NMI "
        f"{codebook['nmi_mean']:.3f} (by seed {nmi[0]:.3f}-{nmi[1]:.3f}) |",
        f"| offline priors | {priors['samples_per_prompt']} scores of the initial policy per pool prompt, drawn "
        f"{priors['drawn']} (each seed is its own task); {priors['rollouts']:,} rollouts, against "
        f"{priors['training_rollouts']:,} training rollouts a run |",
        f"| start | held-out success {notes['start_held_out_success']:.3f} (seed mean) |",
        "",
        "## Revisits, measured from the runs' draws",
        "",
        "| arm | prompts given rollouts a run | visits per drawn prompt: max | mean | held-out prompts drawn |",
        "|---|---|---|---|---|",
        *[f"| {regime.ARMS[key].label} | {_count(r)} | {r['max']:g} | {r['mean']:g} | {r['held_out_drawn']:g} |"
          for key, r in notes["revisits_by_arm"].items()],
        f"| **all {len(suite.results)} runs** | | **{summary.revisits['max']:g}** | **{summary.revisits['mean']:g}** "
        f"| **{summary.revisits['held_out_drawn']:g}** |",
        "",
        *_priors_lines(notes),
        "## Every arm, read by the rule",
        "",
        f"Reference: GRPO n=8, final held-out success {format_interval(reference.final, digits=4)}. *Difference*: "
        "final held-out success, arm minus GRPO n=8, mean over paired seeds with its 95% t-interval "
        "(`stats.paired_difference`, the revised rule's); *verdict*: `rule.verdict` (ahead / behind / level: the "
        "interval above, below or around zero); *rollouts to reach*: `stats.reach_interval`, the rollouts the arm's "
        "seed-mean curve needs to reach the reference's final value over the reference's own (judges nothing). Priors "
        "arms are judged with their priors' rollouts counted (`regime.final_with_priors`) and shown with training "
        "rollouts only beside.",
        "",
        "| arm | final held-out success | difference to GRPO n=8 | verdict | rollouts to reach (x GRPO n=8) |",
        "|---|---|---|---|---|",
    ]
    for key, arm in summary.arms.items():
        label = regime.ARMS[key].label
        if arm.training_only is None:
            lines.append(f"| {label} | {format_interval(arm.final, digits=4)} | {_difference(arm.difference, key)} | "
                         f"{arm.verdict} | {format_reach(arm.reach)} |")
            continue
        counted = f"{label}, priors counted (judged" + (": the start value, arithmetic)" if priors.get(
            "counted_final_is_start") else ")")
        lines.append(f"| {counted} | {format_interval(arm.final, digits=4)} | {_difference(arm.difference, key)} | "
                     f"**{arm.verdict}** | {format_reach(arm.reach)} |")
        final = stats.Interval(**priors["training_only_final"][key])
        reach = stats.Interval(**priors["training_only_reach"][key])
        lines.append(f"| {label}, training rollouts only | {format_interval(final, digits=4)} | "
                     f"{_difference(arm.training_only, key)} | ({verdict(arm.training_only)}) | "
                     f"{format_reach(reach)} |")
    headroom = notes["headroom_over_rpp1"]
    spo = notes["spo1_vs_rpp1"]
    lines += [
        "",
        "Limits, their lead over REINFORCE++ n=1 (`rule.headroom`, in held-out success): "
        + "; ".join(f"{regime.ARMS[key].label}: {value:+.4f}" for key, value in headroom.items()) + ".",
        "",
        "## SPO n=1 against REINFORCE++ n=1",
        "",
        f"With no revisits SPO's tracker is at its prior (0.5) at every visit, so its advantage is the batch-whitened "
        f"reward, as REINFORCE++'s. Measured on the runs' own rows ({len(summary.seeds)} seeds x {pool['steps']} "
        "steps x 128 rows): "
        f"rewards identical in every row: {spo['rewards_identical_every_row']}; advantages bit-identical: "
        f"{spo['advantages_bit_identical']}; held-out curves bit-identical: {spo['held_out_curves_bit_identical']}. "
        f"Largest advantage gap {spo['max_abs_advantage_gap']:.3g} (in {spo['rows_with_a_gap_share']:.1%} of the rows; "
        f"first at step {_first(spo['first_step_with_a_gap_per_seed'])}), largest final held-out gap "
        f"{spo['max_abs_final_gap']:.3g}. Where they differ, it is rounding: SPO divides by std + 1e-8 in float64, "
        "verl's REINFORCE++ multiplies by rsqrt(var + 1e-8) in float32.",
        "",
        "## The oracle allocation",
        "",
        f"Each step's {knapsack['prompts_per_step']:g} prompts (GRPO n=2's) split {pool['rollouts_per_step']} rollouts "
        f"by `instruments.allocation.knapsack_allocation` (0 or {KNAPSACK_LOW}..{KNAPSACK_HIGH}) from the true p; "
        f"verl's GRPO groups the rows by uid. Rollouts a step: {knapsack['rollouts_per_step_min']:g}-"
        f"{knapsack['rollouts_per_step_max']:g}; prompts trained a step: "
        f"{knapsack['prompts_trained_per_step_mean']:.1f} on average (the rest get 0 rollouts, are not trained on "
        "and never come back); group sizes "
        f"{knapsack['group_size_min']:g}-{knapsack['group_size_max']:g}, mean {knapsack['group_size_mean']:.2f}.",
        "",
        "## The learning-rate check",
        "",
        f"The package's best arm by `rule.best_package_arm` (priors counted), picked after the x1 runs and before any "
        f"learning-rate run: **{regime.ARMS[notes['best_package_arm']].label}**. Each arm at lr x f against GRPO n=8 "
        "at the same lr x f.",
        "",
        "| arm | lr factor | final held-out success | difference to GRPO n=8 at the same factor | verdict |",
        "|---|---|---|---|---|",
    ]
    for key in lr_arms(notes["best_package_arm"]):
        for factor in (FACTORS[0], 1.0, FACTORS[1]):
            name = f"x{factor:g}"
            final = notes["lr_finals"][key][name]
            lines.append(f"| {regime.ARMS[key].label} | {name} (lr {pool['lr'] * factor:g}) | "
                         f"{format_interval(stats.Interval(final['value'], final['low'], final['high']), digits=4)} | "
                         f"{_difference(summary.lr_check[key][name], key)} | {final['verdict']} |")
    lines += ["", f"![held-out success per arm]({PLOT})", ""]
    path = out / "regime.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _plot(summary: regime.InstrumentSummary, suite: SuiteRuns, path: Path) -> None:
    """Held-out success per arm; the same minus GRPO n=8, paired by seed (the tasks differ by seed, so the absolute
    bands overlap where the paired differences do not); the rule's final differences."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(16, 12), dpi=DPI)
    grid = fig.add_gridspec(2, 2, height_ratios=[3, 2])
    curves, gaps, finals = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])
    x, reference = suite.x, suite.curves(regime.REFERENCE)
    colours = plt.get_cmap("tab20")([*range(0, 20, 2), 1])  # 11 distinct hues (tab20's dark shades, then one)
    for colour, (key, arm) in zip(colours, regime.IN_LABS.items(), strict=True):
        style = "--" if arm.limit else (":" if arm.priors else "-")
        width = 2.4 if key == regime.REFERENCE else 1.3
        curves.plot(x, suite.curves(key).mean(0), style, color=colour, lw=width, label=arm.label)
        mean, low, high = stats.band(suite.curves(key) - reference)
        gaps.plot(x, mean, style, color=colour, lw=width)
        gaps.fill_between(x, low, high, color=colour, alpha=0.15)
    curves.set(xlabel="training rollouts", ylabel="held-out expected success", title="Held-out success, seed mean")
    curves.legend(fontsize=7, loc="lower right")
    gaps.axhline(0.0, color="k", lw=0.8)
    gaps.set(xlabel="training rollouts (priors arms: without the priors' rollouts)", ylabel="minus GRPO n=8",
             title="Held-out success minus GRPO n=8, paired by seed (95% band)")
    rows = [(regime.ARMS[key].label + (" (priors counted)" if arm.training_only is not None else ""), arm.difference)
            for key, arm in summary.arms.items() if key != regime.REFERENCE]  # fmt: skip
    rows += [(f"{regime.ARMS[key].label} (training only)", arm.training_only) for key, arm in summary.arms.items()
             if arm.training_only is not None]  # fmt: skip
    for index, (_, interval) in enumerate(rows):
        finals.errorbar(interval.value, index, xerr=[[interval.value - interval.low], [interval.high - interval.value]],
                        fmt="o", color="C3" if interval.high < 0 else ("C2" if interval.low > 0 else "C7"), capsize=3)
    finals.axvline(0.0, color="k", lw=0.8)
    finals.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=7)
    finals.set(xlabel="final held-out success minus GRPO n=8 (95% paired CI)",
               title="The rule's final difference: green ahead, red behind, grey level")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _priors_lines(notes: dict) -> list[str]:
    """The informative contrast first (each priors arm minus its twin, training rollouts only), then what the
    counted figure is, and that priors are paid once."""
    priors = notes["priors"]
    contrasts = priors.get("minus_twin_training_only", {})
    if not contrasts:
        return []
    lines = ["## What the priors bought", "",
             "Each priors arm minus its twin without priors, final held-out success, training rollouts only, paired "
             "by seed (95% paired t-interval):", ""]
    for key, found in contrasts.items():
        interval = stats.Interval(found["value"], found["low"], found["high"])
        lines.append(f"- {regime.ARMS[key].label} minus {regime.ARMS[found['twin']].label}: "
                     f"{format_interval(interval, signed=True, digits=4)}")
    times = priors["rollouts"] / priors["training_rollouts"]
    lines += ["", f"The priors are {priors['rollouts']:,} rollouts, {times:.0f}x a run's training rollouts, and a "
              "one-off cost: a user generates them once for a dataset and an "
              "initial policy and reuses them across runs."]
    if priors.get("counted_final_is_start"):
        lines += ["", "Counted in the budget, as the rule judges them, a priors arm has not trained at all by the "
                  "reference's final rollouts: its counted final is each seed's start value, the same number for both "
                  "priors arms. Their counted difference to GRPO n=8 below is arithmetic, not a measurement of the "
                  "priors."]
    return [*lines, ""]


def _ran(suite: SuiteRuns) -> str:
    if suite.ran == len(suite.results):
        return f"running all {suite.ran} runs"
    return f"running {suite.ran} of the {len(suite.results)} runs; the rest came from an earlier invocation's cache"


def _count(revisit: dict[str, float]) -> str:
    low, high = revisit["drawn_prompts_per_run_min"], revisit["drawn_prompts_per_run_max"]
    return f"{low:,.0f}" if low == high else f"{low:,.0f}-{high:,.0f}"


def _first(steps: list[int | None]) -> str:
    known = [s for s in steps if s is not None]
    return "none" if not known else f"{min(known)}-{max(known)}" if min(known) != max(known) else str(known[0])


def _difference(interval: stats.Interval, key: str) -> str:
    if key == regime.REFERENCE:
        return "0 (the reference)"
    return format_interval(interval, signed=True, digits=4)


__all__ = ["PLOT", "write_report"]
