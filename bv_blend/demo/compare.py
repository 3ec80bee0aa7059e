"""The multi-seed comparison behind scripts/compare_cpu.py: named arms (a verl estimator, its overrides, a group size),
several seeds, on verl's stock trainer on CPU, each run validated on the demo's held-out prompts; tables, a plot,
docs/benchmarks.md.

An arm is declared once, in :data:`ARMS` (its estimator and the hydra overrides on top of the demo's), and run at a
group size n (``grpo:8``). Every arm of a comparison gets the same rollout budget per step (``rollouts_per_step`` =
prompts x n), so a smaller group sees more prompts. A seed sets the order of training prompts (or the sampler's
draws) and vLLM's sampling; every run of a comparison shares one task, training pool, warmed-up model and codebook
(prepared once, in ``<out>/prepared``), so the runs of one seed differ only by their arm, and every arm is compared
with a reference arm paired by seed.

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
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from bv_blend.demo import report  # noqa: E402
from bv_blend.demo.pipeline import DemoSettings, Prepared, follow_steps, run_method  # noqa: E402
from bv_blend.lab import stats as lab_stats  # noqa: E402

RESULT_FILE = "result.json"
BEGIN, END = "<!-- compare_cpu:begin -->", "<!-- compare_cpu:end -->"


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
    def arm_n(self) -> tuple[str, int]:
        return self.arm, self.n

    @property
    def label(self) -> str:
        return arm_label(self.arm, self.n, self.batch)

    @property
    def samples_by_history(self) -> bool:
        return SAMPLER_ON in self.overrides

    def describe(self) -> dict:
        """What decides this run's result, as stored in its result.json (JSON has no tuples)."""
        return {**asdict(self), "overrides": list(self.overrides)}


def arm_label(arm: str, n: int, batch: int) -> str:
    return f"{arm} n={n} ({batch} prompts)"


def parse_arm(text: str) -> tuple[str, int]:
    """``"grpo:8"`` -> ``("grpo", 8)``; raises ValueError with the arms there are."""
    name, sep, n = text.partition(":")
    if not sep or not n.strip().isdigit():
        raise ValueError(f"{text!r} is not ARM:N (an arm and its group size, e.g. grpo:8)")
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; the arms are {', '.join(ARMS)} (bv_blend/demo/compare.py, ARMS)")
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


def settings_key(s: DemoSettings) -> dict[str, str]:
    """What a result depends on besides its RunSpec: a restart must use the same, or its results would mix. The
    training pool's size is the preparation's ``n_train``."""
    keys = ("steps", "lr", "val_samples", "test_freq")
    return {**s.preparation_key(), **{k: str(getattr(s, k)) for k in keys}}


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


# ------------------------------------------------------------------------------------ what a run logged besides
ADV_MAX, ADV_MIN = "critic/advantages/max", "critic/advantages/min"  # verl's, over the valid tokens of a step
OWN_ABS_MAX = ("bv_blend/abs_advantage_max",)  # an estimator's own, where verl's is missing
TESTING_TIME = "timing_s/testing"
SAMPLER_PREFIX = "sampler/"
SPO_P_HAT = "spo/p_hat_mean"  # SPO's mean p^ over a batch's prompts: what the sampler moves, with or without it
# Which estimators' "signal" (share of groups that get a non-zero advantage) the demo's reader defines: GRPO's
# from the groups' scores, BV-Blend's logged; SPO gives every row r - p^, so a share of groups says nothing.
SIGNAL_DEFINED = ("grpo", "bv_blend")


def max_abs_advantage(metrics: pd.DataFrame) -> float:
    """The largest |A| of any token of the run: verl's ``critic/advantages/max|min``, else the estimator's own."""
    train = report.training_steps(metrics)
    if ADV_MAX in train and ADV_MIN in train:
        return float(max(train[ADV_MAX].abs().max(), train[ADV_MIN].abs().max()))
    own = [train[c].max() for c in OWN_ABS_MAX if c in train]
    return float(max(own)) if own else float("nan")


def between_steps_s(metrics: pd.DataFrame, rollout_dir: Path) -> float:
    """Mean wall time a step spends outside verl's step timer and its validation, from the rollout dump's times.

    verl's V1 trainer (the one the CPU harness runs, trainer/ppo/v1/trainer_base.py ``fit``) times ``step`` from
    fetching the step's batch (``prepare_step``: the history sampler's draw) to the actor update, then validates
    (``timing_s/testing``), computes the step's metrics, dumps its rollouts (``rollouts/<step>.jsonl``) and logs. So
    between the dumps of steps k and k+1 lie the logging of step k, step k+1, its validation and its metrics; this
    subtracts the two timed parts, leaving what no timer of verl covers. The dump is written by verl's one-thread
    executor, a few milliseconds after it is handed over: a mean over steps is exact to about that. The gap after
    step 1 is left out (step 2 of a run is still warming up vLLM's and the agent loop's first-use paths).
    """
    times = {int(p.stem): p.stat().st_mtime for p in rollout_dir.glob("*.jsonl") if p.stem.isdigit()}
    train = report.training_steps(metrics)
    gaps = []
    for k in sorted(times):
        if k < 2 or k + 1 not in times or k + 1 not in train.index:
            continue
        testing = train.at[k + 1, TESTING_TIME] if TESTING_TIME in train else float("nan")
        gaps.append(times[k + 1] - times[k] - train.at[k + 1, report.STEP_TIME]
                    - (0.0 if math.isnan(testing) else testing))
    return float(np.mean(gaps)) if gaps else float("nan")


def extra_summary(metrics: pd.DataFrame, rollout_dir: Path) -> dict[str, float]:
    """The comparison's numbers beyond the demo's run summary: max |A|, the advantage step's time, the time between
    steps, and the means over training steps of the sampler's and SPO's logged metrics (absent when not logged)."""
    train = report.training_steps(metrics)
    steady = train.iloc[1:] if len(train) > 1 else train  # step 1 holds vLLM's first-use costs
    out = {
        "max |A|": max_abs_advantage(metrics),
        "adv time ms": 1000 * float(steady[report.ADV_TIME].mean()) if report.ADV_TIME in steady else float("nan"),
        "between steps s": between_steps_s(metrics, rollout_dir),
    }
    for column in sorted(c for c in train.columns if c.startswith(SAMPLER_PREFIX) or c == SPO_P_HAT):
        out[column] = float(train[column].mean())
    return out


def result_of(spec: RunSpec, key: dict[str, str], record: report.RunRecord, wall_s: float,
              rollout_dir: Path | None = None) -> dict:
    """What the tables and plots need from one run, small enough to keep forever."""
    summary = record.summary()
    summary["all-equal %"] = summary["all-right %"] + summary["all-wrong %"]
    if rollout_dir is not None:
        summary |= extra_summary(record.metrics, rollout_dir)
    return {
        "spec": spec.describe(),
        "settings": key,
        "validation": {str(step): float(v) for step, v in record.validation[report.OVERALL].items()},
        "families_after": {f: float(v) for f, v in record.validation.loc[record.last_val].items()},
        "signal": {str(step): float(v) for step, v in record.signal.items()},
        "summary": summary,
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
        run_method(s, spec.estimator, prepared, folder, n=spec.n, batch=spec.batch, seed=spec.seed,
                   extra=spec.overrides)
    finally:
        stop.set()
        follower.join()
    record = report.read_run(spec.estimator, folder, prepared.question_family)
    if spec.estimator not in SIGNAL_DEFINED:
        record = replace(record, signal=pd.Series(dtype=float))
    result = result_of(spec, key, record, time.time() - started, folder / "rollouts")
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


def reach_ratio(arm: dict[int, dict], reference: dict[int, dict], rollouts_per_step: int) -> float:
    """Rollouts for ``arm``'s seed-mean held-out curve to reach the reference's final value, over the reference's
    own (the token-level lab's definition, bv_blend/lab/stats.py), on the seeds and validation steps both have;
    inf when the arm never reaches it, nan when nothing is shared or the reference starts at its final value."""
    seeds = sorted(set(arm) & set(reference))
    if not seeds:
        return float("nan")
    steps = sorted(set.intersection(*({int(s) for s in runs[seed]["validation"]}
                                      for runs in (arm, reference) for seed in seeds)))
    if not steps:
        return float("nan")
    x = np.asarray(steps, dtype=float) * rollouts_per_step
    return lab_stats.reach_ratio(_curve_matrix(arm, seeds, steps), _curve_matrix(reference, seeds, steps), x, x)


def _reach_text(ratio: float) -> str:
    if math.isnan(ratio):
        return "n/a"
    return "> 1.00x (not reached)" if math.isinf(ratio) else f"{ratio:.2f}x"


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
                                     "rollouts to reach, x ref": "1 (by definition)"}
            continue
        if not seeds:
            continue
        diffs = [mine[seed]["summary"]["val after"] - ref[seed]["summary"]["val after"] for seed in seeds]
        mean, half = mean_ci(diffs)
        verdict = ("no difference resolved" if math.isnan(half) or abs(mean) <= half
                   else f"{key[0] if mean > 0 else reference[0]} ahead")
        rows[_label_of(runs)] = {"seeds": str(len(seeds)), f"minus {ref_label} (final)": _fmt(mean, half, sign=True),
                                 "95% CI": verdict,
                                 "rollouts to reach, x ref": _reach_text(reach_ratio(mine, ref, rollouts))}
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


def results_markdown(results: Sequence[dict], command: str, cpu: str, png_name: str, wall_s: float | None,
                     settings: dict[str, str], date: str, missing: Sequence[str] = (),
                     reference: tuple[str, int] | None = ("grpo", 8)) -> str:
    """The generated part of docs/benchmarks.md; ``missing`` names the runs of the grid not finished yet, and
    ``wall_s`` is this invocation's wall time (``None`` when it ran nothing)."""
    partial = [] if not missing else [
        f"**Partial results: {len(results)} of {len(results) + len(missing)} runs.** Not run yet: "
        f"{', '.join(missing)}. The same command (without `--report`) runs them; the tables below cover the finished "
        "runs only, so an arm with fewer seeds has a wider interval (none with one seed).",
        "",
    ]
    ref = resolve_reference(results, reference)
    ref_label = _label_of(_arms(results)[ref]) if ref is not None else "the reference"
    sampler = sampler_table(results)
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
        "(linear between validations; the token-level lab's definition):",
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
    doc.write_text("# CPU benchmark on verl's stock trainer\n\n" + generated + "\n")
    return doc
