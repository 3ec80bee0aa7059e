"""The tables, plot and docs/benchmarks.md section of a multi-seed comparison (instruments.demo.compare runs it): per
arm, the held-out pass rate over validations, the gain, all-equal groups, max |A| and step times (mean and 95%
t-interval over seeds); every arm paired by seed with a reference arm (difference of final pass rates, rollouts to
reach the reference's final pass rate, lab's definition, instruments/stats.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from instruments import stats as lab_stats  # noqa: E402
from instruments.demo import report  # noqa: E402
from instruments.demo.compare import ARMS, SAMPLER_PREFIX, SPO_P_HAT, arm_label  # noqa: E402

SECTION = "compare_cpu"  # the markers of the current comparison's results in docs/benchmarks.md


def markers(section: str = SECTION) -> tuple[str, str]:
    """The markers between which a comparison's generated results go: one pair per section of the docs file, so that
    two comparisons (the current one, the no-revisit regime's) can write into one file without overwriting."""
    return f"<!-- {section}:begin -->", f"<!-- {section}:end -->"


BEGIN, END = markers()


# ---------------------------------------------------------------------------------------------------- summary
def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval over seeds, runs without the value left out (nan with one)."""
    return report.mean_ci(np.asarray([v for v in values if not math.isnan(v)], dtype=float))


def _arm_of(result: dict) -> tuple[str, int]:
    return result["spec"]["arm"], result["spec"]["n"]


def _arms(results: Sequence[dict]) -> dict[tuple[str, int], list[dict]]:
    """Results by (arm, n), in the order the arms first appear (the command's order)."""
    arms: dict[tuple[str, int], list[dict]] = {}
    for r in results:
        arms.setdefault(_arm_of(r), []).append(r)
    return arms


def _label_of(runs: Sequence[dict]) -> str:
    spec = runs[0]["spec"]
    return arm_label(spec["arm"], spec["n"], spec["batch"])


def curves(results: Sequence[dict]) -> pd.DataFrame:
    """Held-out pass rate per arm and validation step: mean and 95% half-width over seeds."""
    rows = []
    for runs in _arms(results).values():
        steps = sorted({int(s) for r in runs for s in r["validation"]})
        for step in steps:
            mean, half = mean_ci([r["validation"].get(str(step), float("nan")) for r in runs])
            rows.append({"arm": _label_of(runs), "step": step, "mean": mean, "ci95": half, "seeds": len(runs)})
    return pd.DataFrame(rows, columns=["arm", "step", "mean", "ci95", "seeds"])


def _fmt(mean: float, half: float, digits: int = 3, sign: bool = False) -> str:
    if math.isnan(mean):
        return "n/a"
    text = f"{mean:+.{digits}f}" if sign else f"{mean:.{digits}f}"
    return text if math.isnan(half) else f"{text} ± {half:.{digits}f}"


def _seed_mean(runs: Sequence[dict], key: str, digits: int) -> str:
    values = [r["summary"].get(key, float("nan")) for r in runs]
    values = [v for v in values if not math.isnan(v)]
    return f"{np.mean(values):.{digits}f}" if values else "n/a"


def summary_table(results: Sequence[dict]) -> pd.DataFrame:
    """One row per arm: held-out pass rate before/after and the gain (mean ± 95% CI over seeds), then, averaged over
    seeds, the all-equal groups (all-right + all-wrong), signal, max |A| and the times."""
    rows = {}
    for runs in _arms(results).values():
        col = {k: [r["summary"].get(k, float("nan")) for r in runs] for k in ("val before", "val after", "gain")}
        rows[_label_of(runs)] = {
            "seeds": str(len(runs)),
            "val before": _fmt(*mean_ci(col["val before"])),
            "val after": _fmt(*mean_ci(col["val after"])),
            "gain": _fmt(*mean_ci(col["gain"]), sign=True),
            "all-equal % (right + wrong)": f"{_seed_mean(runs, 'all-equal %', 1)} ({_seed_mean(runs, 'all-right %', 1)}"
                                           f" + {_seed_mean(runs, 'all-wrong %', 1)})",
            "signal ratio": _seed_mean(runs, "signal ratio", 3),
            "max abs(A)": _max_over_seeds(runs, "max |A|"),
            "step time s": _seed_mean(runs, "step time s", 2),
            "adv ms": _seed_mean(runs, "adv time ms", 1),
            "between steps s": _seed_mean(runs, "between steps s", 3),
        }
    return pd.DataFrame(rows).T


def _max_over_seeds(runs: Sequence[dict], key: str) -> str:
    values = [r["summary"].get(key, float("nan")) for r in runs]
    values = [v for v in values if not math.isnan(v)]
    return f"{max(values):.2f}" if values else "n/a"


def sampler_table(results: Sequence[dict]) -> pd.DataFrame:
    """Per arm that logged them, the seed means of the sampler's metrics (means over steps) and of SPO's mean p^."""
    rows = {}
    for runs in _arms(results).values():
        columns = sorted({k for r in runs for k in r["summary"] if k.startswith(SAMPLER_PREFIX) or k == SPO_P_HAT})
        if columns:
            rows[_label_of(runs)] = {c: _seed_mean(runs, c, 3) for c in columns}
    return pd.DataFrame(rows).T.fillna("-")


def _by_seed(runs: Sequence[dict]) -> dict[int, dict]:
    return {r["spec"]["seed"]: r for r in runs}


def _curve_matrix(runs: dict[int, dict], seeds: Sequence[int], steps: Sequence[int]) -> np.ndarray:
    return np.array([[runs[seed]["validation"][str(step)] for step in steps] for seed in seeds], dtype=float)


def _aligned(arm: dict[int, dict], reference: dict[int, dict], rollouts_per_step: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The two arms' held-out curves on the seeds and validation steps both have, and those steps in rollouts; None
    when nothing is shared."""
    seeds = sorted(set(arm) & set(reference))
    if not seeds:
        return None
    steps = sorted(set.intersection(*({int(s) for s in runs[seed]["validation"]}
                                      for runs in (arm, reference) for seed in seeds)))
    if not steps:
        return None
    x = np.asarray(steps, dtype=float) * rollouts_per_step
    return _curve_matrix(arm, seeds, steps), _curve_matrix(reference, seeds, steps), x, x


def reach_ratio(arm: dict[int, dict], reference: dict[int, dict], rollouts_per_step: int) -> float:
    """Rollouts for ``arm``'s seed-mean held-out curve to reach the reference's final value, over the reference's
    own (the token-level lab's definition, instruments/stats.py), on the seeds and validation steps both have;
    inf when the arm never reaches it, nan when nothing is shared or the reference starts at its final value."""
    aligned = _aligned(arm, reference, rollouts_per_step)
    return float("nan") if aligned is None else lab_stats.reach_ratio(*aligned)


def reach_interval(arm: dict[int, dict], reference: dict[int, dict], rollouts_per_step: int) -> lab_stats.Interval:
    """:func:`reach_ratio` with the token-level lab's paired bootstrap CI over the shared seeds (with a handful of
    seeds and four validations it is coarse, and says so by its width)."""
    aligned = _aligned(arm, reference, rollouts_per_step)
    nan = float("nan")
    return lab_stats.Interval(nan, nan, nan) if aligned is None else lab_stats.reach_interval(*aligned)


def resolve_reference(results: Sequence[dict], reference: tuple[str, int] | None) -> tuple[str, int] | None:
    """The reference arm: the one asked for if it has results, else the first arm (None without results)."""
    arms = _arms(results)
    if reference is not None and reference in arms:
        return reference
    return next(iter(arms), None)


def paired_differences(results: Sequence[dict], reference: tuple[str, int] | None = ("grpo", 8)) -> pd.DataFrame:
    """Every arm against ``reference`` (or the first arm when it has no results), paired by seed: the difference of
    final held-out pass rates (mean ± 95% t-interval over the shared seeds) and the rollouts to reach the
    reference's final pass rate as a ratio to the reference's (:func:`reach_ratio`)."""
    reference = resolve_reference(results, reference)
    if reference is None:
        return pd.DataFrame()
    arms = _arms(results)
    ref = _by_seed(arms[reference])
    ref_label = _label_of(arms[reference])
    rollouts = arms[reference][0]["spec"]["n"] * arms[reference][0]["spec"]["batch"]
    rows = {}
    for key, runs in arms.items():
        mine = _by_seed(runs)
        seeds = sorted(set(mine) & set(ref))
        if key == reference:
            rows[_label_of(runs)] = {"seeds": str(len(seeds)), f"minus {ref_label} (final)": "-", "95% CI": "-",
                                     "rollouts to reach, x ref": "1 (by definition)", "its 95% CI": "-"}
            continue
        if not seeds:
            continue
        diffs = [mine[seed]["summary"]["val after"] - ref[seed]["summary"]["val after"] for seed in seeds]
        mean, half = mean_ci(diffs)
        verdict = ("no difference resolved" if math.isnan(half) or abs(mean) <= half
                   else f"{key[0] if mean > 0 else reference[0]} ahead")
        reach = reach_interval(mine, ref, rollouts)
        rows[_label_of(runs)] = {"seeds": str(len(seeds)), f"minus {ref_label} (final)": _fmt(mean, half, sign=True),
                                 "95% CI": verdict,
                                 "rollouts to reach, x ref": lab_stats.format_reach(reach, point=True),
                                 "its 95% CI": lab_stats.format_reach_bounds(reach)}
    return pd.DataFrame(rows).T


def plot_comparison(results: Sequence[dict], out_png: Path, reference: tuple[str, int] | None = ("grpo", 8)) -> Path:
    """Held-out pass rate over steps (mean, 95% band over seeds) beside each arm's paired difference to the
    reference over steps (mean over the shared seeds, 95% t-band)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    arms = _arms(results)
    reference = resolve_reference(results, reference)
    ref = _by_seed(arms[reference]) if reference is not None else {}
    for i, (key, runs) in enumerate(arms.items()):
        color, label = colors[i % len(colors)], _label_of(runs)
        frame = curves(runs)
        axes[0].plot(frame["step"], frame["mean"], marker="o", color=color, label=label)
        band = frame["ci95"].fillna(0.0)
        axes[0].fill_between(frame["step"], frame["mean"] - band, frame["mean"] + band, color=color, alpha=0.15)
        mine = _by_seed(runs)
        seeds = sorted(set(mine) & set(ref))
        if key == reference or not seeds:
            continue
        steps = sorted(set.intersection(*({int(s) for s in d[seed]["validation"]} for d in (mine, ref)
                                          for seed in seeds)))
        diff = _curve_matrix(mine, seeds, steps) - _curve_matrix(ref, seeds, steps)
        stats_at = [mean_ci(diff[:, j]) for j in range(len(steps))]
        mean = np.array([m for m, _ in stats_at])
        half = np.nan_to_num(np.array([h for _, h in stats_at]))
        axes[1].plot(steps, mean, marker="o", color=color, label=label)
        axes[1].fill_between(steps, mean - half, mean + half, color=color, alpha=0.15)
    axes[0].set_title("held-out pass rate, T=1 (band: 95% CI over seeds)")
    ref_text = _label_of(arms[reference]) if reference is not None else "the reference"
    axes[1].set_title(f"minus {ref_text}, paired by seed (band: 95% CI)")
    axes[1].axhline(0.0, color="black", linewidth=0.8)
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png


def _markdown_table(frame: pd.DataFrame) -> str:
    header = "| | " + " | ".join(frame.columns) + " |"
    rule = "|---" * (len(frame.columns) + 1) + "|"
    body = ["| " + str(idx) + " | " + " | ".join(str(v) for v in row) + " |" for idx, row in frame.iterrows()]
    return "\n".join([header, rule, *body])


def _arm_definitions(results: Sequence[dict]) -> list[str]:
    lines = []
    for (name, _), runs in _arms(results).items():
        spec = runs[0]["spec"]
        overrides = " ".join(f"`{o}`" for o in spec["overrides"]) or "none"
        line = f"- `{name}`: `algorithm.adv_estimator={spec['estimator']}`, overrides {overrides}"
        about = ARMS[name].about if name in ARMS else ""
        lines.append(line + (f" ({about})" if about else ""))
    return list(dict.fromkeys(lines))  # an arm run at two group sizes is described once


def runs_machines(results: Sequence[dict], here: str) -> str:
    """Where the runs ran, from each result's ``cpu``: a comparison resumed on another machine spans several kinds of
    CPU. Results from before runs recorded it are taken as measured ``here`` when none records one."""
    counts = Counter(r.get("cpu") for r in results)
    if set(counts) == {None}:
        return here
    if len(counts) == 1:
        return str(next(iter(counts)))
    parts = [f"{cpu} ({n} runs)" for cpu, n in counts.items() if cpu is not None]
    if None in counts:
        parts.append(f"{counts[None]} runs without a recorded CPU")
    return "; ".join(parts)


def results_markdown(results: Sequence[dict], command: str, cpu: str, png_name: str, wall_s: float | None,
                     settings: dict[str, str], date: str, missing: Sequence[str] = (),
                     reference: tuple[str, int] | None = ("grpo", 8), section: str = SECTION) -> str:
    """The generated part of docs/benchmarks.md; ``missing`` names the runs of the grid not finished yet, and
    ``wall_s`` is this invocation's wall time (``None`` when it ran nothing); between ``section``'s markers."""
    partial = [] if not missing else [
        f"**Partial results: {len(results)} of {len(results) + len(missing)} runs.** Not run yet: "
        f"{', '.join(missing)}. The same command (without `--report`) runs them; the tables below cover the finished "
        "runs only, so an arm with fewer seeds has a wider interval (none with one seed).",
        "",
    ]
    ref = resolve_reference(results, reference)
    ref_label = _label_of(_arms(results)[ref]) if ref is not None else "the reference"
    sampler = sampler_table(results)
    begin, end = markers(section)
    return "\n".join([
        begin,
        *partial,
        f"Measured {date} on `{runs_machines(results, cpu)}`, "
        f"{sum(r['wall_s'] for r in results) / 3600:.1f} h of verl runs"
        + ("" if wall_s is None else f" ({wall_s / 3600:.1f} h wall for this invocation)") + ", with",
        "",
        "```bash",
        command,
        "```",
        "",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()) + ".",
        "",
        "Arms:",
        "",
        *_arm_definitions(results),
        "",
        "Held-out pass rate at T=1 (mean ± 95% t-interval over seeds), before and after training, and the rest "
        "averaged over seeds (max abs(A): the largest over seeds). All-equal %: groups whose rollouts all scored "
        "the same (every group at n=1). Signal ratio: groups with a non-zero advantage (n/a for SPO, which gives "
        "every row r - p^). Step time: verl's `timing_s/step`, which includes fetching the step's batch (the "
        "sampler's draw); adv ms: its `timing_s/adv`; between steps: the time per step outside verl's step timer "
        "and its validation (logging, metrics). Step 1 is left out of the times.",
        "",
        _markdown_table(summary_table(results)),
        "",
        f"Every arm minus {ref_label} in final held-out pass rate, paired by seed, and the rollouts each arm's "
        "seed-mean curve needs to reach the reference's final pass rate, as a ratio to the reference's own "
        "(linear between validations; the token-level lab's definition), with its paired bootstrap 95% CI over "
        "the seeds (coarse with a handful of seeds and four validations):",
        "",
        _markdown_table(paired_differences(results, reference)),
        "",
        *([] if sampler.empty else [
            "Sampler and SPO metrics (means over training steps, then over seeds):",
            "",
            _markdown_table(sampler),
            "",
        ]),
        f"![held-out pass rate and the paired difference to the reference]({png_name})",
        end,
    ])


def write_benchmarks(doc: Path, generated: str, section: str = SECTION) -> Path:
    """Puts ``generated`` between ``section``'s markers of ``doc`` (hand-written text around them is kept)."""
    begin, end = markers(section)
    if doc.is_file():
        text = doc.read_text()
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            tail = rest.split(end, 1)[1]
            doc.write_text(head + generated + tail)
            return doc
        raise ValueError(f"{doc} has no {begin} ... {end} markers; add them where the results go, or pass "
                         "another --docs file or --section")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("# CPU benchmark on verl's stock trainer\n\n" + generated + "\n")
    return doc
