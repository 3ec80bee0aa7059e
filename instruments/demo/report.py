"""The demo's report (scripts/demo_cpu.py): its methods' runs from one shared start, compared in tables, a plot and
the summary; each method's line says whether the held-out pass rate rose above the start. The runs are read, and
their intervals computed, by instruments/run/report.py (whose docstring says how the intervals are paired)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from instruments.run.report import (  # noqa: E402
    OVERALL,
    RunRecord,
    StartRecord,
    paired_ci,
    pass_rate_ci,
    prompt_means,
)


def method_difference(runs: dict[str, RunRecord], baseline: str = "grpo",
                      method: str = "bv_blend") -> tuple[float, float]:
    """``method`` minus ``baseline`` in final held-out pass rate, paired by prompt, and its 95% half-width.

    From a shared start this is exactly the difference of the two gains, with the start's noise cancelled: each
    gain's interval includes that same noise, so whether the two gains' intervals overlap is not the test.
    """
    a, b = runs[baseline], runs[method]
    return paired_ci(prompt_means(a.samples, a.last_val), prompt_means(b.samples, b.last_val))


def shared_start(runs: dict[str, RunRecord]) -> StartRecord:
    """The start every run shares; the demo's tables need one (its gains are measured from it)."""
    starts = {id(r.start): r.start for r in runs.values()}
    if len(starts) != 1 or None in starts.values():
        raise ValueError("the demo's tables compare runs from one shared start: read every run with the same "
                         "read_run(..., start=share_start(first).start)")
    return next(iter(starts.values()))


# ------------------------------------------------------------------------------------------------- tables, plot
def pass_rate_table(runs: dict[str, RunRecord]) -> pd.DataFrame:
    """Rows: families and ``all``; columns: ``start`` (the shared start), then ``<method> after`` and
    ``<method> gain`` (from the start) per method: held-out pass rates."""
    start = shared_start(runs)
    columns = {"start": start.validation.iloc[0]}
    for method, run in runs.items():
        after = run.validation.loc[run.last_val]
        columns[f"{method} after"] = after
        columns[f"{method} gain"] = after - columns["start"]
    return pd.DataFrame(columns)


def stats_table(runs: dict[str, RunRecord]) -> pd.DataFrame:
    """Rows: methods; columns: the final pass rate and the gain from the shared start with their intervals, answer
    format, signal, group shares, step time."""
    rows = {}
    for method, run in runs.items():
        s = run.summary()
        rows[method] = {
            f"after (step {run.last_val})": f"{s['val after']:.3f} ± {s['val after ±']:.3f}",
            "gain from start (95% CI)": f"{s['gain']:+.3f} ± {s['gain ±']:.3f}",
            "in format": f"{s['in format before']:.2f} -> {s['in format after']:.2f}",
            "signal ratio": f"{s['signal ratio']:.3f}",
            "GRPO signal ratio": f"{s['GRPO signal ratio']:.3f}",
            "all-right %": f"{s['all-right %']:.1f}",
            "all-wrong %": f"{s['all-wrong %']:.1f}",
            "step time s": f"{s['step time s']:.2f}",
            "adv share %": f"{s['adv share %']:.2f}",
        }
    return pd.DataFrame(rows).T


def _samples_per_prompt(run: RunRecord) -> int:
    at = run.samples[run.samples["step"] == run.last_val]
    return int(round(len(at) / at["question"].nunique()))


def demo_tables(runs: dict[str, RunRecord]) -> str:
    """The tables the demo prints and writes to table.txt: the shared start, per family, per method, the difference."""
    start = shared_start(runs)
    s = start.summary()
    last = max(r.last_val for r in runs.values())
    after_samples = sorted({_samples_per_prompt(r) for r in runs.values()})
    table = pass_rate_table(runs)
    rates = table.to_string(formatters={c: (lambda v: f"{v:+.3f}") if c.endswith(" gain") else (lambda v: f"{v:.3f}")
                                        for c in table.columns})
    lines = [
        f"shared start (step {start.step}: the model before any RL step, validated once by verl, in the "
        f"{start.source} run before its first update, for every method): "
        f"{s['pass rate']:.3f} ± {s['pass rate ±']:.3f} (95% CI; {start.prompts} held-out prompts x "
        f"{start.samples_per_prompt} responses at T=1; from sampling the responses alone ± "
        f"{s['pass rate ± sampling']:.3f}), in format {s['in format']:.2f}",
        "",
        f"held-out pass rate (T=1) per family: the shared start, after training (step {last}, "
        f"{'/'.join(map(str, after_samples))} responses per prompt) and the gain from the start",
        rates,
        "",
        stats_table(runs).to_string(),
    ]
    if {"grpo", "bv_blend"} <= set(runs):
        diff, half = method_difference(runs)
        lines += ["", f"bv_blend - grpo after training, paired by prompt (= the difference of the gains, the start "
                      f"being shared): {diff:+.3f} ± {half:.3f}"]
    lines += ["", *(f"{method}: {learning_verdict(run)}" for method, run in runs.items())]
    return "\n".join(lines)


def learning_verdict(run: RunRecord) -> str:
    """Whether the model learned, said plainly: the gain from the start with its 95% interval over prompts."""
    s = run.summary()
    gain, half = s["gain"], s["gain ±"]
    if not np.isfinite(half):
        return f"held-out gain {gain:+.3f} (one prompt: no interval)"
    if gain - half > 0:
        return f"learned: the held-out pass rate rose above the start ({gain:+.3f} ± {half:.3f})"
    if gain + half < 0:
        return f"got worse: the held-out pass rate fell below the start ({gain:+.3f} ± {half:.3f})"
    return f"did not learn measurably: the held-out gain {gain:+.3f} ± {half:.3f} holds zero"


def demo_summary(runs: dict[str, RunRecord]) -> dict:
    """summary.json's numbers: the shared start, each run's summary (gain from the start), the methods' difference."""
    out: dict = {"start": shared_start(runs).summary(), "runs": {m: r.summary() for m, r in runs.items()}}
    if {"grpo", "bv_blend"} <= set(runs):
        diff, half = method_difference(runs)
        out["bv_blend - grpo after"] = {"difference": diff, "difference ±": half}
    return out


def plot_runs(runs: dict[str, RunRecord], out_png: Path) -> Path:
    """Held-out pass rate over steps (95% band over prompts) beside the effective signal ratio, one line per
    method, every line starting from the shared start (drawn once, black, with its interval); a third panel shows
    each family's held-out pass rate."""
    start = shared_start(runs)
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (method, run) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        steps = list(run.validation.index)
        cis = [pass_rate_ci(run.samples, step) for step in steps]
        mean = np.array([c[0] for c in cis])
        half = np.array([c[1] for c in cis])
        axes[0].plot(steps, run.validation[OVERALL], marker="o", color=color, label=method)
        axes[0].fill_between(steps, mean - half, mean + half, color=color, alpha=0.15)
        axes[1].plot(run.signal.index, run.signal.values, marker=".", color=color, label=method)
        for j, family in enumerate(c for c in run.validation.columns if c != OVERALL):
            axes[2].plot(steps, run.validation[family], color=colors[j % len(colors)],
                         linestyle="-" if i == 0 else "--", label=f"{family} ({method})")
    rate, half0 = pass_rate_ci(start.samples, start.step)
    axes[0].errorbar([start.step], [rate], yerr=[half0], fmt="s", color="black", capsize=4, zorder=5,
                     label=f"shared start ({start.samples_per_prompt} responses/prompt)")
    titles = ["held-out pass rate, T=1 (band: 95% over prompts)", "effective signal ratio (groups with signal)",
              "held-out pass rate per family"]
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    axes[1].legend()
    axes[2].legend(fontsize=7, ncol=2)
    axes[1].set_ylim(0, 1.05)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png
