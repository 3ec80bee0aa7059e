"""The no-revisit regime's recommendation: read each instrument's summary (docs/regime/<instrument>.json, written by
scripts/lab_token.py --suite regime, scripts/lab.py --suite regime and scripts/compare_cpu.py's regime command) and
apply the one rule (instruments/rule.py, docs/regime.md) to all of them; writes docs/regime/recommendation.md.

    python scripts/regime_report.py                      # every summary found in docs/regime/
    python scripts/regime_report.py --out /tmp/rec.md    # somewhere else
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

INSTRUMENTS = ("token_lab", "logistic_lab", "verl_cpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--summaries", type=Path, default=None, help="folder of the summaries (default docs/regime)")
    parser.add_argument("--out", type=Path, default=None, help="the report (default <summaries>/recommendation.md)")
    args = parser.parse_args(argv)
    from instruments import regime

    folder = args.summaries or regime.SUMMARY_DIR
    found = {name: regime.read_summary(folder / f"{name}.json") for name in INSTRUMENTS
             if (folder / f"{name}.json").is_file()}
    if not found:
        print(f"[regime] no summary in {folder}: run an instrument's regime suite first (docs/regime.md)",
              file=sys.stderr)
        return 2
    out = args.out or folder / "recommendation.md"
    out.write_text("\n".join(recommendation_lines(found)) + "\n")
    print(f"[regime] {', '.join(found)} -> {out}")
    return 0


def recommendation_lines(found: dict) -> list[str]:
    from instruments import regime, rule, stats

    judged = {name: summary for name, summary in found.items() if len(summary.seeds) >= rule.MIN_SEEDS}
    recommendation = rule.recommend(regime.differences(judged), regime.LIMITS)
    missing = [name for name in INSTRUMENTS if name not in found]
    short = [f"{name} ({len(summary.seeds)} seeds)" for name, summary in found.items() if name not in judged]
    names = list(found)
    lines = ["# The no-revisit regime: what the rule recommends", "",
             "Made by `python scripts/regime_report.py` from the summaries in this folder; the rule is "
             "instruments/rule.py (committed in `59fdb98`, addendum `9f6e701`, both before any regime run; "
             "`rule.MIN_SEEDS` in `ef4381d`, before any of verl's regime results was read). Each cell: "
             "the paired difference of the final held-out pass rate to GRPO n=8 with its 95% interval, and the "
             "verdict; priors arms with their offline rollouts counted.", ""]
    if missing:
        lines += [f"**Instruments without a finished regime run**: {', '.join(missing)}. The recommendation below "
                  "reads only the others and changes when they land.", ""]
    if short:
        lines += [f"**Reported, not judged** (fewer than {rule.MIN_SEEDS} paired seeds, `rule.MIN_SEEDS`): "
                  f"{', '.join(short)}. Their columns show the numbers; the recommendation does not read them.", ""]
    headers = [name if name in judged else f"{name} (not judged)" for name in names]
    lines += ["| arm | " + " | ".join(headers) + " |", "|---" * (len(names) + 1) + "|"]
    for key, arm in regime.ARMS.items():
        if key == regime.REFERENCE:
            continue
        cells = []
        for name in names:
            summary = found[name].arms.get(key)
            cells.append("not run" if summary is None
                         else f"{stats.format_interval(summary.difference, signed=True)} {summary.verdict}")
        lines.append(f"| {arm.label} | " + " | ".join(cells) + " |")
    lines += [""]
    if recommendation.arm is None:
        lines += ["**Recommendation: GRPO n=8 stays.** No runnable arm is ahead in one instrument and behind in "
                  "none.", ""]
    else:
        others = [regime.ARMS[k].label for k in recommendation.qualified[1:]]
        also = f"; also qualified, in the rule's order: {', '.join(others)}." if others else "."
        lines += [f"**Recommendation: {regime.ARMS[recommendation.arm].label}.** Ahead in at least one instrument and "
                  "behind in none" + also, ""]
    lines += ["Limits (never recommended): their lead over REINFORCE++ n=1 (rule.headroom), per instrument:", ""]
    for key in sorted(regime.LIMITS):
        leads = []
        for name in names:
            arms = found[name].arms
            if key in arms and regime.HEADROOM_BASE in arms:
                lead = rule.headroom(arms[key].difference, arms[regime.HEADROOM_BASE].difference)
                leads.append(f"{name} {lead:+.3f}")
        lines.append(f"- {regime.ARMS[key].label}: {', '.join(leads) or 'not run'}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
