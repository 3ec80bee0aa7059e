"""The demo's report (scripts/demo_cpu.py): what its one run can know, beside what the committed comparison knows.

This run's part: the held-out pass rate before training (step 0) and after it (the last validation), per family and
over all held-out prompts, each with its 95% t-interval over held-out prompts, and the gain paired by prompt
(instruments/run/report.py reads the run and says why the pairing). "learned" is said only where the gain's interval
lies above zero, else "did not learn", plainly. These intervals are the noise of measuring one run on a finite set
of prompts with a few samples each; they say nothing of how differently another seed would train.

The comparison's part, labelled as its: the five-seed final of the same arm and of GRPO n = 8, and their paired
difference with the rule's verdict, read from results/regime/pretrained_lm.json, never restated by hand.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from instruments import regime  # noqa: E402
from instruments.run.report import (  # noqa: E402
    OVERALL,
    REWARD,
    RunRecord,
    mean_ci,
    pass_rate_ci,
    prompt_means,
    training_steps,
)
from instruments.stats import Interval, format_interval  # noqa: E402

LEARNED = "learned"
DID_NOT_LEARN = "did not learn"
# verl's family pass rate (val-core) and the same rate from its validation dump agree to float rounding in one run
DUMP_LOG_TOLERANCE = 1e-6


# ------------------------------------------------------------------------------------------- the comparison's result
@dataclass(frozen=True)
class Comparison:
    """The committed comparison's reading of the demo's arm: finals and the paired difference over its seeds."""

    source: Path
    seeds: list[int]
    arm_label: str
    arm_final: Interval
    arm_finals: list[float]  # per seed, in ``seeds``' order
    reference_label: str
    reference_final: Interval
    difference: Interval  # the arm minus the reference, paired by seed
    verdict: str  # the rule's: ahead, level or behind

    def seed_final(self, seed: int) -> float | None:
        """The comparison's final of this arm at ``seed``, where it ran that seed."""
        return self.arm_finals[self.seeds.index(seed)] if seed in self.seeds else None


def read_comparison(path: Path, arm: str) -> Comparison:
    """The arm's and GRPO n = 8's readings from a committed regime summary; raises with the fix where the file is
    missing, or lacks the arm, the reference or the per-seed finals."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; the demo sets its run beside the comparison's result there "
                                "(scripts/compare_cpu.py --regime-summary writes it; the repository commits it)")
    summary = regime.read_summary(path)
    missing = [key for key in (arm, regime.REFERENCE) if key not in summary.arms]
    if missing:
        raise ValueError(f"{path} holds no reading of {missing} (its arms: {sorted(summary.arms)}): not the "
                         "comparison the demo's arm comes from")
    reading, reference = summary.arms[arm], summary.arms[regime.REFERENCE]
    if reading.finals is None or len(reading.finals) != len(summary.seeds):
        raise ValueError(f"{path}: the {arm} arm records no final per seed ({summary.seeds})")
    return Comparison(source=path, seeds=list(summary.seeds), arm_label=regime.ARMS[arm].label,
                      arm_final=reading.final, arm_finals=list(reading.finals),
                      reference_label=regime.ARMS[regime.REFERENCE].label, reference_final=reference.final,
                      difference=reading.difference, verdict=reading.verdict)


# --------------------------------------------------------------------------------------------------- this run
@dataclass(frozen=True)
class RunAbout:
    """What the report says of the run besides its numbers."""

    label: str  # the arm's name in the comparison
    estimator: str
    batch: int  # prompts a step
    n: int  # rollouts a prompt
    steps: int
    lr: float
    dtype: str
    seed: int
    differences: tuple[str, ...] = ()  # each setting that differs from the comparison's, "name: theirs -> ours"

    @property
    def comparison_setting(self) -> bool:
        """Whether the run trained as the comparison's runs of this arm did (validating less often changes no
        training step)."""
        return all(d.startswith("test_freq:") for d in self.differences)


@dataclass(frozen=True)
class HeldOut:
    """One row of the held-out table: a family, or all held-out prompts."""

    prompts: int
    before: Interval
    after: Interval
    gain: Interval  # after minus before, paired by prompt

    @property
    def verdict(self) -> str:
        return learning_verdict(self.gain)


def _interval(mean_and_half: tuple[float, float]) -> Interval:
    mean, half = mean_and_half
    return Interval(mean, mean - half, mean + half)


def learning_verdict(gain: Interval) -> str:
    """``learned`` only where the gain's 95% interval lies above zero; ``did not learn`` otherwise (a gain whose
    interval holds zero, or a fall). Refuses a gain without an interval: one held-out prompt cannot tell."""
    if not (np.isfinite(gain.low) and np.isfinite(gain.high)):
        raise ValueError(f"the gain {gain.value:+.3f} has no interval (one held-out prompt): it cannot say whether "
                         "the model learned")
    return LEARNED if gain.low > 0 else DID_NOT_LEARN


def check_dump_matches_log(run: RunRecord) -> None:
    """verl logs each family's pass rate (its metrics) and dumps every response (its validation dump) of the same
    validations: refuses a run whose two disagree, the dump of another run or a validation cut short."""
    dumped = sorted(int(s) for s in run.samples["step"].unique())
    logged = sorted(int(s) for s in run.validation.index)
    if dumped != logged:
        raise ValueError(f"the {run.method} run's validation dump holds steps {dumped}, its metrics log validations "
                         f"at {logged}: the dump is incomplete or another run's")
    for step in logged:
        at = run.samples[run.samples["step"] == step]
        for family, rate in at.groupby("family")["score"].mean().items():
            logged_rate = run.validation.loc[step].get(family, np.nan)
            if not abs(rate - logged_rate) <= DUMP_LOG_TOLERANCE:
                raise ValueError(f"the {run.method} run's validation at step {step}: verl logged {logged_rate:.4f} "
                                 f"for {family}, its dump holds {rate:.4f}: the dump is another run's")


def held_out_table(run: RunRecord) -> dict[str, HeldOut]:
    """Family (the task's order), then ``all`` -> the pass rate before and after training and the gain, each with
    its 95% interval over that family's held-out prompts. Refuses a run that cannot show a gain: without a validation
    before training, without one after, with other prompts in the two, or whose dump is not what verl logged."""
    first, last = run.first_val, run.last_val
    if first != 0:
        raise ValueError(f"the {run.method} run has no validation before training (first: step {first}): the demo "
                         "measures the gain from it (trainer.val_before_train=true)")
    if last == first:
        raise ValueError(f"the {run.method} run has no validation after training (only step {first}): did it stop "
                         "before its first training step? Its verl.log says why")
    samples = run.samples
    before_prompts = set(samples.loc[samples["step"] == first, "question"])
    after_prompts = set(samples.loc[samples["step"] == last, "question"])
    if before_prompts != after_prompts:
        raise ValueError(f"the {run.method} run validated {len(before_prompts)} held-out prompts at step {first} and "
                         f"{len(after_prompts)} at step {last}, not the same: the gain is paired by prompt")
    check_dump_matches_log(run)
    families = [f for f in run.validation.columns if f != OVERALL]
    rows = {}
    for name, subset in [*((f, samples[samples["family"] == f]) for f in families), (OVERALL, samples)]:
        before, after = prompt_means(subset, first), prompt_means(subset, last)
        rows[name] = HeldOut(prompts=len(before), before=_interval(mean_ci(before)), after=_interval(mean_ci(after)),
                             gain=_interval(mean_ci(after - before)))
    return rows


def _samples_per_prompt(run: RunRecord, step: int) -> int:
    at = run.samples[run.samples["step"] == step]
    return int(round(len(at) / at["question"].nunique()))


def verdict_sentence(row: HeldOut) -> str:
    """The overall verdict, said plainly, with the numbers it rests on."""
    before, after, gain = (format_interval(row.before), format_interval(row.after),
                           format_interval(row.gain, signed=True))
    if row.verdict == LEARNED:
        return (f"{LEARNED}: the held-out pass rate rose from {before} to {after}, a gain of {gain}, whose 95% "
                "interval lies above zero")
    if row.gain.high < 0:
        return f"{DID_NOT_LEARN}: the held-out pass rate fell from {before} to {after}, a change of {gain}"
    return (f"{DID_NOT_LEARN}: the held-out pass rate went from {before} to {after}, a change of {gain}, whose 95% "
            "interval holds zero: this run cannot tell it from the noise of its measurement")


def _table_lines(rows: dict[str, HeldOut], first: int, last: int) -> list[str]:
    def verdict(row: HeldOut) -> str:
        # a family of one prompt has no interval, so no verdict (the overall, over every prompt, still has one)
        return "one prompt: no interval" if row.prompts < 2 else row.verdict

    width = max(len(name) for name in rows) + 2
    header = (f"{'family':<{width}}{'prompts':>7}  {f'before (step {first})':<24}{f'after (step {last})':<24}"
              f"{'gain, paired by prompt':<27}verdict")
    lines = [header]
    for name, row in rows.items():
        lines.append(f"{name:<{width}}{row.prompts:>7}  {format_interval(row.before):<24}"
                     f"{format_interval(row.after):<24}{format_interval(row.gain, signed=True):<27}{verdict(row)}")
    return lines


def comparison_lines(comparison: Comparison, about: RunAbout) -> list[str]:
    """The committed comparison's result of this arm and of GRPO n = 8, labelled as its, and what it adds."""
    seeds = " ".join(map(str, comparison.seeds))
    width = max(len(comparison.arm_label), len(comparison.reference_label)) + 2
    lines = [
        f"the comparison's result ({comparison.source.name}: {len(comparison.seeds)} seeds, {seeds}; the final "
        "held-out pass rate with its 95% t-interval over seeds):",
        f"  {comparison.arm_label:<{width}}{format_interval(comparison.arm_final)}",
        f"  {comparison.reference_label:<{width}}{format_interval(comparison.reference_final)}",
        f"  {comparison.arm_label} minus GRPO n=8, paired by seed: "
        f"{format_interval(comparison.difference, signed=True)}: {comparison.verdict}",
    ]
    seed_final = comparison.seed_final(about.seed)
    if about.comparison_setting and seed_final is not None:
        lines.append(f"  its own seed-{about.seed} run of this arm, on this run's prompts, ended at {seed_final:.3f} "
                     "(vLLM's sampling on CPU does not repeat a run exactly)")
    if not about.comparison_setting:
        lines.append(f"  this run's settings differ from the comparison's ({'; '.join(about.differences)}): the "
                     "comparison's figures are of another setting")
    lines.append("This demo trains BV-Blend alone: whether it does better than GRPO is the comparison's to say, over "
                 "seeds, not one run's.")
    return lines


def demo_report(run: RunRecord, about: RunAbout, comparison: Comparison) -> str:
    """The text the demo prints and writes to report.txt."""
    rows = held_out_table(run)
    first, last = run.first_val, run.last_val
    overall = rows[OVERALL]
    differences = "; ".join(about.differences)
    if about.comparison_setting:
        kept = "the comparison's settings" + (f" but {differences}" if differences else "")
    else:
        kept = f"settings that differ from the comparison's: {differences}"
    lines = [
        f"{about.label} (verl's algorithm.adv_estimator={about.estimator}, {about.batch} prompts x {about.n} rollouts "
        f"a step), {about.steps} steps at lr {about.lr:g}, {about.dtype}: ONE run, seed {about.seed}; {kept}",
        "",
        f"held-out pass rate of this run (one seed): {overall.prompts} held-out prompts x "
        f"{_samples_per_prompt(run, last)} samples at T=1, before the first update and after the last; 95% "
        "t-intervals over the held-out prompts",
        *_table_lines(rows, first, last),
        "",
        f"this run (one seed): {verdict_sentence(overall)}",
        "Its intervals are the noise of measuring this one run (which prompts were held out, the samples each drew), "
        "not the spread between training runs: another seed trains differently, which only seeds measure.",
        "",
        *comparison_lines(comparison, about),
    ]
    return "\n".join(lines)


def demo_summary(run: RunRecord, about: RunAbout, comparison: Comparison) -> dict[str, Any]:
    """summary.json's numbers: this run's held-out table and verdict, one seed, beside the comparison's reading."""
    rows = held_out_table(run)
    return {
        "run": {**asdict(about), "seeds": 1, "first validation": run.first_val, "last validation": run.last_val,
                "held out": {name: asdict(row) | {"verdict": row.verdict if row.prompts > 1 else None}
                             for name, row in rows.items()},
                "verdict": rows[OVERALL].verdict, "summary": run.summary()},
        "comparison": {**asdict(comparison), "source": str(comparison.source)},
    }


# ------------------------------------------------------------------------------------------------------ the plot
def plot_run(run: RunRecord, comparison: Comparison, out_png: Path) -> Path:
    """Left: the held-out pass rate at each validation (95% band over prompts) and each family's, with the
    comparison's five-seed finals of this arm and GRPO n = 8 at the last step; right: the training batch's pass rate
    (every step on prompts it had not seen) and BV-Blend's effective signal ratio."""
    fig, (held_out, training) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    steps = [int(s) for s in run.validation.index]
    intervals = [pass_rate_ci(run.samples, step) for step in steps]
    mean = np.array([m for m, _ in intervals])
    half = np.array([h for _, h in intervals])
    held_out.plot(steps, mean, marker="o", color="black", linewidth=2, label=f"{OVERALL} (this run, one seed)")
    held_out.fill_between(steps, mean - half, mean + half, color="black", alpha=0.12, label="95% over held-out prompts")
    for i, family in enumerate(c for c in run.validation.columns if c != OVERALL):
        held_out.plot(steps, run.validation[family], marker=".", linewidth=1, color=colors[i % len(colors)],
                      label=family)
    last = steps[-1]
    # the comparison's finals beside the run's last point, in black and grey: the families' colours are taken
    for offset, label, final, color, marker in ((0.3, comparison.arm_label, comparison.arm_final, "black", "s"),
                                                (0.6, "GRPO n=8", comparison.reference_final, "grey", "D")):
        held_out.errorbar([last + offset], [final.value], yerr=[[final.value - final.low], [final.high - final.value]],
                          fmt=marker, mfc="white", color=color, capsize=4,
                          label=f"comparison: {label}, {len(comparison.seeds)} seeds (95% over seeds)")
    held_out.set_title("held-out pass rate, T=1")
    held_out.set_ylim(0, 1.02)
    held_out.legend(fontsize=7)
    train = training_steps(run.metrics)
    if REWARD in train:
        training.plot(train.index, train[REWARD], marker=".", label="training batch pass rate (prompts new each step)")
    if len(run.signal):
        training.plot(run.signal.index, run.signal.values, marker=".", label="effective signal ratio")
    training.set_title("training steps")
    training.set_ylim(0, 1.05)
    training.legend(fontsize=8)
    for ax in (held_out, training):
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png
