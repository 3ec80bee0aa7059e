"""The no-revisit regime's recommendation: read each instrument's summary (results/regime/<instrument>.json, written by
scripts/lab.py --suite regime and scripts/compare_cpu.py's regime command on the pretrained LM) and apply the one rule
(instruments/rule.py, results/regime.md) to all of them; writes results/regime/recommendation.md. The retired
instruments' summaries (the token lab's, the tiny model's on verl) stay with their run record and are not read.

    python scripts/regime_report.py                      # every summary found in results/regime/
    python scripts/regime_report.py --out /tmp/rec.md    # somewhere else
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REVISED_RULE_COMMIT = "9befa39"  # the revised rule's commit (results/regime.md, "The revised rule")
# The instruments whose regime runs were made, and first judged, before the revised rule.
READ_AFTER_THE_FACT = frozenset({"logistic_lab"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--summaries", type=Path, default=None, help="folder of the summaries (default results/regime)")
    parser.add_argument("--out", type=Path, default=None, help="the report (default <summaries>/recommendation.md)")
    args = parser.parse_args(argv)
    from instruments import regime

    folder = args.summaries or regime.SUMMARY_DIR
    found = regime.read_summaries(folder)
    if not found:
        print(f"[regime] no summary in {folder}: run an instrument's regime suite first (results/regime.md)",
              file=sys.stderr)
        return 2
    out = args.out or folder / "recommendation.md"
    out.write_text("\n".join(recommendation_lines(found)) + "\n")
    print(f"[regime] {', '.join(found)} -> {out}")
    return 0


def recommendation_lines(found: dict) -> list[str]:
    from instruments import regime, rule, stats

    judged = {name: summary for name, summary in found.items() if len(summary.seeds) >= rule.MIN_SEEDS}
    recommendation = regime.recommend(found)
    missing = [name for name in regime.INSTRUMENTS if name not in found]
    short = [f"{name} ({len(summary.seeds)} seed{'' if len(summary.seeds) == 1 else 's'})"
             for name, summary in found.items() if name not in judged]
    names = [name for name in regime.INSTRUMENTS if name in found]
    lines = ["# The no-revisit regime: what the rule recommends", "",
             f"Made by `python scripts/regime_report.py` from the summaries in this folder; the rule is "
             f"instruments/rule.py as revised in `{REVISED_RULE_COMMIT}` (issue 37: t-intervals, a pick only where "
             "the leader is resolved ahead of the other qualified arms, else the simplest of the tied set; "
             "results/regime.md, \"The revised rule\"). Each cell: the paired difference of the final held-out pass "
             "rate to GRPO n=8 with its 95% t-interval, and the verdict; priors arms with their offline rollouts "
             "counted.", ""]
    before = [name for name in names if name in READ_AFTER_THE_FACT]
    if before:
        lines += [f"**Read after the fact**: {', '.join(before)} "
                  f"{'was' if len(before) == 1 else 'were'} designed, first run and first judged under the rule's "
                  "first version (`59fdb98`, `rule.MIN_SEEDS` in `ef4381d`: percentile bootstrap intervals, the "
                  "largest difference picks). This is the reading under the revised rule, made after the first "
                  "results were known.", ""]
    stale = [name for name in names if any(arm.finals is None for arm in found[name].arms.values())]
    if stale:
        lines += [f"**Summaries older than the revised rule**: {', '.join(stale)}. Their intervals are the first "
                  "rule's percentile bootstraps and they record no per-seed finals, so no arm can be separated from "
                  "another there; rerunning each instrument's report command rewrites them.", ""]
    if missing:
        lines += [f"**Instruments without a finished regime run**: {', '.join(missing)}. The recommendation below "
                  "reads only the others and changes when they land.", ""]
    if short:
        lines += [f"**Reported, not judged** (fewer than {rule.MIN_SEEDS} paired seeds, `rule.MIN_SEEDS`): "
                  f"{', '.join(short)}. Their columns show the numbers; the recommendation does not read them.", ""]
    headers = [name if name in judged else f"{name} (not judged)" for name in names]
    lines += ["| arm | needs | " + " | ".join(headers) + " |", "|---" * (len(names) + 2) + "|"]
    for key, arm in regime.ARMS.items():
        if key == regime.REFERENCE or not any(key in found[name].arms for name in names):
            continue
        cells = []
        for name in names:
            summary = found[name].arms.get(key)
            cells.append("not run" if summary is None
                         else f"{stats.format_interval(summary.difference, signed=True)} {summary.verdict}")
        lines.append(f"| {arm.label} | {'-' if arm.limit else arm.needs} | " + " | ".join(cells) + " |")
    lines += [""]
    label = lambda key: regime.ARMS[key].label  # noqa: E731
    bought = [(name, key, twin, interval) for name in names
              for key, (twin, interval) in priors_bought(found[name].notes).items()]
    if bought:
        lines += ["**Priors, read with care.** Counted in the budget, a priors arm's figure above is each seed's start "
                  "value wherever the priors' rollouts (8 a prompt of the whole pool) exceed the run's whole budget: "
                  "arithmetic, not a measurement, and the same for every priors arm. What the priors bought is each "
                  "priors arm minus its twin without them, on training rollouts alone (paired by seed); priors are a "
                  "one-off cost that a user reuses across runs:", ""]
        lines += [f"- {name}: {label(key)} minus {label(twin)}: {stats.format_interval(interval, signed=True)}"
                  for name, key, twin, interval in bought]
        lines += [""]
    if recommendation.arm is None:
        lines += ["**Recommendation: GRPO n=8 stays.** No runnable arm is ahead in one instrument and behind in "
                  "none.", ""]
    else:
        order = ", ".join(label(k) for k in recommendation.qualified)
        lines += [f"**Qualified** (ahead in at least one instrument, behind in none), in the rule's order (their "
                  f"difference in {recommendation.tie_breaker}): {order}.", ""]
        if recommendation.leader_margins:
            lines += [f"The leader, {label(recommendation.qualified[0])}, minus each other qualified arm in "
                      f"{recommendation.tie_breaker} (paired t-interval over the seeds both ran):", ""]
            for key, margin in recommendation.leader_margins.items():
                text = "not separable (no paired per-seed finals there)" if margin is None else (
                    f"{stats.format_interval(margin, signed=True)}, "
                    f"{'resolved ahead' if margin.low > 0 else 'not resolved'}")
                lines.append(f"- minus {label(key)}: {text}")
            lines += [""]
        pairs = [(a, b) for i, a in enumerate(recommendation.qualified) for b in recommendation.qualified[i + 1:]]
        if pairs:
            judged_names = [name for name in names if name in judged]
            lines += ["The qualified arms against each other in every judged instrument (paired t-interval of the "
                      "first minus the second over the seeds both ran; judges nothing but the pick above):", "",
                      "| first minus second | " + " | ".join(judged_names) + " |",
                      "|---" * (len(judged_names) + 1) + "|"]
            for a, b in pairs:
                cells = []
                for name in judged_names:
                    arms = found[name].arms
                    both = a in arms and b in arms
                    margin = rule.leader_minus(arms[a].finals, arms[b].finals) if both else None
                    cells.append("not run" if not both else "no per-seed finals" if margin is None
                                 else stats.format_interval(margin, signed=True))
                lines.append(f"| {label(a)} minus {label(b)} | " + " | ".join(cells) + " |")
            lines += [""]
        if recommendation.resolved:
            why = ("the only qualified arm" if len(recommendation.qualified) == 1
                   else "resolved ahead of every other qualified arm")
            lines += [f"**Recommendation: {label(recommendation.arm)}**, {why}.", ""]
        else:
            tied = ", ".join(f"{label(k)} (needs: {regime.ARMS[k].needs})" for k in recommendation.tied)
            lines += [f"**Tied**: {tied}. The leader is not resolved ahead of the others, so the rule recommends the "
                      f"simplest of the tied set (verl's stock estimators first): **{label(recommendation.arm)}**.",
                      ""]
    limits = [key for key in sorted(regime.LIMITS) if any(key in found[name].arms for name in names)]
    if limits:
        lines += ["Limits (never recommended): their lead over REINFORCE++ n=1 (rule.headroom), per instrument:", ""]
    for key in limits:
        leads = []
        for name in names:
            arms = found[name].arms
            if key in arms and regime.HEADROOM_BASE in arms:
                lead = rule.headroom(arms[key].difference, arms[regime.HEADROOM_BASE].difference)
                leads.append(f"{name} {lead:+.3f}")
        lines.append(f"- {label(key)}: {', '.join(leads) or 'not run'}")
    return lines


def priors_bought(notes: dict) -> dict:
    """priors arm -> (its twin, the paired difference to it on training rollouts), from an instrument's notes: the
    logistic lab's ``priors.minus_twin_training_only``."""
    from instruments.stats import Interval

    return {key: (v["twin"], Interval(v["value"], v["low"], v["high"]))
            for key, v in ((notes.get("priors") or {}).get("minus_twin_training_only") or {}).items()}


if __name__ == "__main__":
    sys.exit(main())
