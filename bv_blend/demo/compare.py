"""The multi-seed comparison behind scripts/compare_cpu.py: GRPO and BV-Blend at two group sizes, several seeds, on
verl's stock trainer on CPU, each run validated on the demo's held-out prompts; a table, a plot, docs/benchmarks.md.

Every group size gets the same rollout budget per step (``rollouts_per_step`` = prompts x group size), so a
smaller group sees more prompts: a group of 2 is where the group mean is a poor baseline and BV-Blend's cluster
history should matter most. A seed sets the order of training prompts and vLLM's sampling; every run of a
comparison shares one task, warmed-up model and codebook (prepared once, in ``<out>/prepared``).

Resuming: a run is done when its ``result.json`` exists (written atomically after the run has finished and been
read); a restarted comparison skips done runs. A run that was interrupted restarts from scratch (its folder is
emptied): a run is ~10 minutes, and verl's file logger truncates its metrics file on a resume, so resuming from
verl's checkpoint would save little and split one run's log over several files.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from bv_blend.demo import report  # noqa: E402
from bv_blend.demo.pipeline import DemoSettings, Prepared, follow_steps, run_method  # noqa: E402

RESULT_FILE = "result.json"
BEGIN, END = "<!-- compare_cpu:begin -->", "<!-- compare_cpu:end -->"


@dataclass(frozen=True)
class RunSpec:
    """One verl run of the comparison."""

    method: str
    n: int  # group size (rollouts per prompt)
    batch: int  # prompts per step
    seed: int

    @property
    def name(self) -> str:
        return f"{self.method}_n{self.n}_seed{self.seed}"


def grid(methods: Sequence[str], group_sizes: Sequence[int], rollouts_per_step: int,
         seeds: Sequence[int]) -> list[RunSpec]:
    """Every (seed, group size, method), seeds outermost: an interrupted comparison has whole seeds done first."""
    for n in group_sizes:
        if n < 2 or rollouts_per_step % n:
            raise ValueError(f"group size {n} must be >= 2 and divide --rollouts-per-step {rollouts_per_step}, "
                             "so that every group size gets the same number of rollouts per step")
    if len(set(seeds)) != len(seeds) or len(set(group_sizes)) != len(group_sizes):
        raise ValueError(f"seeds {list(seeds)} and group sizes {list(group_sizes)} must not repeat")
    return [RunSpec(m, n, rollouts_per_step // n, seed) for seed in seeds for n in group_sizes for m in methods]


def settings_key(s: DemoSettings) -> dict[str, str]:
    """What a result depends on besides its RunSpec: a restart must use the same, or its results would mix."""
    keys = ("steps", "lr", "val_samples", "test_freq")
    return {**s.preparation_key(), **{k: str(getattr(s, k)) for k in keys}}


# ------------------------------------------------------------------------------------------------ bookkeeping
def run_dir(out: Path, spec: RunSpec) -> Path:
    return out / "runs" / spec.name


def load_result(out: Path, spec: RunSpec, key: dict[str, str]) -> dict | None:
    """The saved result of a finished run, or None when the run has not finished.

    Raises if the result was made with other settings: mixing them would make the comparison meaningless.
    """
    path = run_dir(out, spec) / RESULT_FILE
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    if result["settings"] != key or result["spec"] != asdict(spec):
        raise ValueError(f"{path} was made with other settings ({result['settings']}, {result['spec']}); "
                         f"now {key}, {asdict(spec)}. Use another --out folder, or the command that made it.")
    return result


def pending(out: Path, specs: Sequence[RunSpec], key: dict[str, str]) -> list[RunSpec]:
    """The runs without a saved result, in order."""
    return [spec for spec in specs if load_result(out, spec, key) is None]


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


def result_of(spec: RunSpec, key: dict[str, str], record: report.RunRecord, wall_s: float) -> dict:
    """What the tables and plots need from one run, small enough to keep forever."""
    return {
        "spec": asdict(spec),
        "settings": key,
        "validation": {str(step): float(v) for step, v in record.validation[report.OVERALL].items()},
        "families_after": {f: float(v) for f, v in record.validation.loc[record.last_val].items()},
        "signal": {str(step): float(v) for step, v in record.signal.items()},
        "summary": record.summary(),
        "wall_s": wall_s,
    }


# ---------------------------------------------------------------------------------------------------- running
def run_one(s: DemoSettings, prepared: Prepared, out: Path, spec: RunSpec, key: dict[str, str],
            on_step: Callable[[int], None] = lambda step: None) -> dict:
    """Runs one spec from scratch, reads it, saves and returns its result. The verl run runs in this thread, so that
    an interrupt reaches run_trainer, which then stops every process of the run."""
    folder = fresh_run_dir(out, spec)
    stop = threading.Event()
    follower = threading.Thread(target=follow_steps, args=(folder / "metrics.jsonl", on_step, stop), daemon=True)
    follower.start()
    started = time.time()
    try:
        run_method(s, spec.method, prepared, folder, n=spec.n, batch=spec.batch, seed=spec.seed)
    finally:
        stop.set()
        follower.join()
    record = report.read_run(spec.method, folder, prepared.question_family)
    result = result_of(spec, key, record, time.time() - started)
    save_result(out, spec, result)
    return result


# ---------------------------------------------------------------------------------------------------- summary
def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval over seeds (nan with one seed)."""
    x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if len(x) == 0:
        return float("nan"), float("nan")
    if len(x) == 1:
        return float(x[0]), float("nan")
    return float(x.mean()), float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def _label(method: str, n: int, batch: int) -> str:
    return f"{method} n={n} ({batch} prompts)"


def _arms(results: Sequence[dict]) -> dict[tuple[str, int, int], list[dict]]:
    arms: dict[tuple[str, int, int], list[dict]] = {}
    for r in results:
        spec = r["spec"]
        arms.setdefault((spec["method"], spec["n"], spec["batch"]), []).append(r)
    return arms


def curves(results: Sequence[dict]) -> pd.DataFrame:
    """Held-out pass rate per arm and validation step: mean and 95% half-width over seeds."""
    rows = []
    for (method, n, batch), runs in _arms(results).items():
        steps = sorted({int(s) for r in runs for s in r["validation"]})
        for step in steps:
            mean, half = mean_ci([r["validation"].get(str(step), float("nan")) for r in runs])
            rows.append({"arm": _label(method, n, batch), "step": step, "mean": mean, "ci95": half,
                         "seeds": len(runs)})
    return pd.DataFrame(rows, columns=["arm", "step", "mean", "ci95", "seeds"])


def _fmt(mean: float, half: float, digits: int = 3, sign: bool = False) -> str:
    text = f"{mean:+.{digits}f}" if sign else f"{mean:.{digits}f}"
    return text if math.isnan(half) else f"{text} ± {half:.{digits}f}"


def summary_table(results: Sequence[dict]) -> pd.DataFrame:
    """One row per arm: held-out pass rate before/after and the gain (mean ± 95% CI over seeds), signal, shares,
    step time and the advantage step's share of it (means over seeds)."""
    rows = {}
    for (method, n, batch), runs in sorted(_arms(results).items(), key=lambda kv: (kv[0][1], kv[0][0])):
        col = {k: [r["summary"][k] for r in runs] for k in runs[0]["summary"]}
        rows[_label(method, n, batch)] = {
            "seeds": str(len(runs)),
            "val before": _fmt(*mean_ci(col["val before"])),
            "val after": _fmt(*mean_ci(col["val after"])),
            "gain": _fmt(*mean_ci(col["gain"]), sign=True),
            "signal ratio": f"{np.mean(col['signal ratio']):.3f}",
            "all-right %": f"{np.mean(col['all-right %']):.1f}",
            "all-wrong %": f"{np.mean(col['all-wrong %']):.1f}",
            "step time s": f"{np.mean(col['step time s']):.2f}",
            "adv share %": f"{np.mean(col['adv share %']):.2f}",
        }
    return pd.DataFrame(rows).T


def paired_differences(results: Sequence[dict], baseline: str = "grpo", method: str = "bv_blend") -> pd.DataFrame:
    """Per group size: ``method`` minus ``baseline`` in final held-out pass rate, paired by seed (mean ± 95% CI)."""
    final = {(r["spec"]["method"], r["spec"]["n"], r["spec"]["seed"]): r["summary"]["val after"] for r in results}
    rows = {}
    for n in sorted({key[1] for key in final}):
        diffs = [final[(method, n, seed)] - final[(baseline, n, seed)]
                 for (m, size, seed) in final if m == method and size == n and (baseline, n, seed) in final]
        if diffs:
            mean, half = mean_ci(diffs)
            verdict = ("no difference resolved" if math.isnan(half) or abs(mean) <= half
                       else f"{method if mean > 0 else baseline} ahead")
            rows[f"n={n}"] = {"seeds": len(diffs), f"{method} - {baseline} (final)": _fmt(mean, half, sign=True),
                              "95% CI": verdict}
    return pd.DataFrame(rows).T


def plot_comparison(results: Sequence[dict], out_png: Path) -> Path:
    """Held-out pass rate over steps (mean, 95% band over seeds) beside the effective signal ratio (seed mean)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    table = curves(results)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (arm, frame) in enumerate(table.groupby("arm", sort=True)):
        color = colors[i % len(colors)]
        axes[0].plot(frame["step"], frame["mean"], marker="o", color=color, label=arm)
        band = frame["ci95"].fillna(0.0)
        axes[0].fill_between(frame["step"], frame["mean"] - band, frame["mean"] + band, color=color, alpha=0.15)
    for i, ((method, n, batch), runs) in enumerate(sorted(_arms(results).items())):
        signal = pd.DataFrame([{int(k): v for k, v in r["signal"].items()} for r in runs]).mean()
        axes[1].plot(signal.index, signal.values, color=colors[i % len(colors)], label=_label(method, n, batch))
    axes[0].set_title("held-out pass rate, T=1 (band: 95% CI over seeds)")
    axes[1].set_title("effective signal ratio (mean over seeds)")
    axes[1].set_ylim(0, 1.05)
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
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


def results_markdown(results: Sequence[dict], command: str, cpu: str, png_name: str, wall_s: float | None,
                     settings: dict[str, str], date: str, missing: Sequence[str] = ()) -> str:
    """The generated part of docs/benchmarks.md; ``missing`` names the runs of the grid not finished yet, and
    ``wall_s`` is this invocation's wall time (``None`` when it ran nothing)."""
    partial = [] if not missing else [
        f"**Partial results: {len(results)} of {len(results) + len(missing)} runs.** Not run yet: "
        f"{', '.join(missing)}. The same command (without `--report`) runs them; the tables below cover the finished "
        "runs only, so an arm with fewer seeds has a wider interval (none with one seed).",
        "",
    ]
    return "\n".join([
        BEGIN,
        *partial,
        f"Measured {date} on `{cpu}`, {sum(r['wall_s'] for r in results) / 3600:.1f} h of verl runs"
        + ("" if wall_s is None else f" ({wall_s / 3600:.1f} h wall for this invocation)") + ", with",
        "",
        "```bash",
        command,
        "```",
        "",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()) + ".",
        "",
        "Held-out pass rate at T=1 (mean ± 95% t-interval over seeds), before and after training, and the rest "
        "averaged over seeds:",
        "",
        _markdown_table(summary_table(results)),
        "",
        "BV-Blend minus GRPO in final held-out pass rate, paired by seed:",
        "",
        _markdown_table(paired_differences(results)),
        "",
        f"![held-out pass rate and signal ratio]({png_name})",
        END,
    ])


def write_benchmarks(doc: Path, generated: str) -> Path:
    """Puts ``generated`` between the markers of ``doc`` (hand-written text around them is kept)."""
    if doc.is_file():
        text = doc.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            tail = rest.split(END, 1)[1]
            doc.write_text(head + generated + tail)
            return doc
        raise ValueError(f"{doc} has no {BEGIN} ... {END} markers; add them where the results go, or pass "
                         "another --docs file")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("# CPU benchmark: GRPO vs BV-Blend on verl's stock trainer\n\n" + generated + "\n")
    return doc
