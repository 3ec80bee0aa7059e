"""The fair verdict's campaign (results/fair_verdict.md; the plan: instruments/fair_verdict.py): every run the design
still needs, in its committed order, read from the state the repository keeps; ``scripts/fair_verdict.py`` runs them
one at a time and ``scripts/tune_lr.py`` runs one arm's tuning alone, both with the commands built here.

The order, each stage's runs listed only once what decides them is known:

a. **GRPO n = 8's tuning** (instruments/tuning.py: its next runs, on the tuning seeds), its rate the cold start's;
b. **the cold start's selection**: GRPO n = 8 at that rate on the task ``cold``, tuning seeds 100 and 101, 20 steps,
   then 40 only if 20 fails (instruments/cold_start.py);
c. **REINFORCE++ n = 1's tuning**, then **BV-Blend n = 2's**;
d. **the judged runs at each tuned arm's own rate** (GRPO n = 8, REINFORCE++ n = 1, BV-Blend n = 2), seeds 0-4,
   seed-major; an arm whose rate is the committed comparison's (2e-5) runs nothing: the committed runs count;
e. **the cold start's arms** (fair_verdict.COLD_ARMS), if the selection accepted a length: seeds 0-4, seed-major
   (seed 0 of every arm, then seed 1, ...: a partial campaign holds whole seeds), at that length, each at its own
   rate (an arm without one at GRPO's; the history sampler's arm at BV-Blend n = 2's, fair_verdict.SAME_RATE_AS;
   BV-Blend n = 8 is tuned only in f, so it runs here at GRPO's), DAPO's arm stopped at GRPO's rollouts;
f. last, the first cut if compute runs out: **BV-Blend n = 8's tuning**, then its judged runs at its own rate.

Every run is one ``scripts/compare_cpu.py`` comparison of one arm at one seed, in the comparison folder of its arm
and rate (fair_verdict's layout, the same under ``results/regime/`` for its state and under the runner's ``--out``),
with the pretrained-LM comparison's settings (SmolLM2 in fp32, 64 rollouts a step, 4 samples a held-out prompt, a pool
of 64 x steps distinct problems: the n = 1 arms draw 64 a step, none twice; DAPO, stopped at 64 x steps generated
rollouts, draws about one eighth of it) and ``--runs-only``. A run is done when its ``result.json`` is in the state.

The runner records each launch as it makes it (``launches.jsonl`` in the state: the run, when, from which commit, on
which CPU), so that an attempt lost with its machine (nothing of it reaches a result) is still in the repository once
the state is committed: the report names, for each finished run, the launches that left no attempt in its result.

An arm's cold runs keep the rate of its first finished cold run: seeds of one arm never mix rates, even if a choice
appears while they run (BV-Blend n = 8's, were it tuned early).

Everything here is verl-free and runs nothing: the state in, the runs and the decisions to write out.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from instruments import cold_start, fair_verdict, tuning
from instruments.fair_verdict import (
    COLD_ARMS,
    COLD_STEPS,
    COLD_TEST_FREQ,
    CUT_FIRST,
    JUDGED_SEEDS,
    REFERENCE,
    ROLLOUTS_PER_STEP,
    TUNED_ARMS,
    arm_folder,
    lr_folder,
    run_folder,
    steps_folder,
)
from instruments.machine import describe_cpu
from instruments.provenance import commit_at_start, committed_file
from instruments.strict_json import strict_dumps

ROOT = fair_verdict.ROOT
RESULT = "result.json"
# fair_verdict's state folders, relative to results/regime/: the same under a temporary state and under --out
TUNING = fair_verdict.TUNING.relative_to(fair_verdict.REGIME)
OWN_LR = fair_verdict.OWN_LR.relative_to(fair_verdict.REGIME)
COMMITTED = fair_verdict.COMMITTED.relative_to(fair_verdict.REGIME)
COLD = fair_verdict.COLD.relative_to(fair_verdict.REGIME)
COLD_SELECTION = fair_verdict.COLD_SELECTION.relative_to(fair_verdict.REGIME)
COLD_ARMS_STATE = fair_verdict.COLD_ARMS_STATE.relative_to(fair_verdict.REGIME)
STATE_FOLDERS = (TUNING, OWN_LR, COLD_SELECTION, COLD_ARMS_STATE)  # what a new machine restores
MIN_TUNING_RUNS = len(tuning.START_LRS) * len(tuning.TUNING_SEEDS)  # the fewest runs an arm's tuning takes

TUNING_STAGE, SELECTION_STAGE, OWN_STAGE, COLD_STAGE = "tuning", "cold selection", "own rate", "cold start"
LAUNCHES = "launches.jsonl"  # in the state's root: one line a launch, appended as the runner makes it


# ----------------------------------------------------------------------------------------------- the commands
def wide_steps() -> int:
    """The pretrained-LM comparison's steps, fixed on GRPO n = 8 (results/regime/pretrained_lm_settings.json)."""
    return int(json.loads(fair_verdict.SETTINGS.read_text())["steps"])


def compare_command(arm: str, lr: float, seed: int, out: Path, *, steps: int, task: str, test_freq: int,
                    stop_at_rollouts: int | None = None) -> list[str]:
    """One run of one arm, alone in its comparison folder ``out``: the pretrained-LM comparison's settings (SmolLM2 in
    fp32, 64 rollouts a step, 4 samples a held-out prompt, a pool of 64 x steps distinct problems) but the rate, the
    task, the steps and the validations."""
    pool = ROLLOUTS_PER_STEP * steps  # as the comparison: its n = 1 arms draw 64 prompts a step, none twice
    return [sys.executable, str(ROOT / "scripts" / "compare_cpu.py"), "--model", "smollm2", "--dtype", "fp32",
            "--task", task, "--distinct-train", "--train-prompts", str(pool), "--arms", arm, "--seeds", str(seed),
            "--rollouts-per-step", str(ROLLOUTS_PER_STEP), "--steps", str(steps), "--test-freq", str(test_freq),
            "--val-samples", str(fair_verdict.VAL_SAMPLES), "--lr", f"{lr:g}", "--out", str(out), "--runs-only",
            *([] if stop_at_rollouts is None else ["--stop-at-rollouts", str(stop_at_rollouts)])]


def tuning_command(arm: str, lr: float, seed: int, arm_out: Path) -> list[str]:
    """A tuning run: the comparison's settings on the wide task but the rate, in ``arm_out/lr_<x>`` (tune_lr's)."""
    return compare_command(arm, lr, seed, arm_out / lr_folder(lr), steps=wide_steps(), task="wide",
                           test_freq=fair_verdict.WIDE_TEST_FREQ)


def state_command(action: str, runs: Path, state: Path) -> list[str]:
    """scripts/run_state.py: ``save`` a comparison folder's state into the repository, or ``restore`` it."""
    return [sys.executable, str(ROOT / "scripts" / "run_state.py"), action, str(runs), str(state)]


@dataclass(frozen=True)
class Run:
    """One run the campaign needs: an arm at a rate and a seed, in its comparison folder."""

    stage: str
    arm: str
    lr: float
    seed: int
    steps: int
    task: str
    test_freq: int
    folder: Path  # the comparison's folder, relative to results/regime/ (its state) and to the runner's --out
    stop_at_rollouts: int | None = None

    def command(self, out: Path) -> list[str]:
        return compare_command(self.arm, self.lr, self.seed, out / self.folder, steps=self.steps, task=self.task,
                               test_freq=self.test_freq, stop_at_rollouts=self.stop_at_rollouts)

    def run_dir(self, root: Path) -> Path:
        """Its run folder under ``root``: the runner's --out while it runs, the state's results/regime/ after."""
        return root / self.folder / "runs" / run_folder(self.arm, self.seed)

    def result(self, regime: Path) -> Path:
        """Where its result lies in the state once it has finished."""
        return self.run_dir(regime) / RESULT

    def describe(self) -> str:
        stop = "" if self.stop_at_rollouts is None else f", stopped at {self.stop_at_rollouts:,} rollouts"
        return (f"{self.stage}: {self.arm} lr {self.lr:g} seed {self.seed} ({self.task}, {self.steps} steps{stop})")


@dataclass(frozen=True)
class Plan:
    """What the campaign still needs, read from the state."""

    runs: tuple[Run, ...]  # every run decided now, in the order they run (the runner takes the first)
    waiting: tuple[str, ...]  # what is not decided yet, and what it waits for
    notes: tuple[str, ...]  # what the state has decided: rates chosen, committed runs that count, the selection
    estimated: int  # runs still needed: the decided ones, and the fewest the undecided need where they run at all

    @property
    def complete(self) -> bool:
        return not self.runs and not self.waiting


# ------------------------------------------------------------------------------------------------ launches
def record_launch(regime: Path, run: Run) -> dict:
    """Appends the launch of ``run`` to the state's ``launches.jsonl``, before the run starts: which run (its result's
    path in the state), when, from which commit (and whether the tree was clean), on which CPU; returns the line."""
    line = {"result": str(run.result(regime).relative_to(regime)), "run": run.describe(),
            "launched_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **commit_at_start(), "cpu": describe_cpu()}
    regime.mkdir(parents=True, exist_ok=True)
    with (regime / LAUNCHES).open("a") as f:
        f.write(strict_dumps(line, indent=None) + "\n")
    return line


def read_launches(regime: Path) -> dict[str, list[dict]]:
    """The launches the state records, by their run's result path (relative to ``regime``), oldest first."""
    path = regime / LAUNCHES
    launches: dict[str, list[dict]] = {}
    for number, text in enumerate(path.read_text().splitlines() if path.is_file() else [], 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
            launches.setdefault(line["result"], []).append(line)
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}, line {number}, is not a launch record ({e}): restore the file from git "
                             f"(git checkout -- {path.name}), or delete the line") from e
    return {result: sorted(lines, key=lambda line: line["launched_utc"]) for result, lines in launches.items()}


def launches_without_attempt(launches: Sequence[dict], attempt_starts: Iterable[str | None]) -> list[dict]:
    """The launches of one run that left no attempt in its result: none of the result's attempts (kept or replaced)
    started between the launch and the run's next launch: an attempt lost with its machine, or a launch that failed
    before verl started, or one that only re-read a run verl had finished (it starts no attempt). A result whose
    attempts' starts are not kept cannot tell: it names none."""
    starts = [datetime.fromisoformat(s) for s in attempt_starts if s]
    if not starts or not launches:
        return []
    times = [datetime.fromisoformat(line["launched_utc"]) for line in launches]
    ends = [*times[1:], None]
    return [line for line, launched, end in zip(launches, times, ends, strict=True)
            if not any(launched <= s and (end is None or s < end) for s in starts)]


# ------------------------------------------------------------------------------------------ reading the state
def tuning_finals(state: Path, arm: str, steps: int | None = None) -> dict[float, dict[int, float]]:
    """lr -> seed -> final held-out pass rate (at ``steps``, the comparison's by default), from the finished tuning
    runs saved in an arm's tuning ``state`` (``lr_tuning/<arm>_n<n>/``)."""
    steps = wide_steps() if steps is None else steps
    found: dict[float, dict[int, float]] = {}
    for path in sorted(state.glob(f"lr_*/runs/{arm_folder(arm)}_seed*/{RESULT}")):
        result = json.loads(path.read_text())
        lr, seed = float(result["settings"]["lr"]), int(result["spec"]["seed"])
        found.setdefault(lr, {})[seed] = float(result["validation"][str(steps)])
    return found


def write_choice(arm: str, state: Path) -> Path:
    """Writes an arm's choice beside its tuning runs' state, with the commit of the rules that made it; refuses while
    the procedure still needs runs (tuning.choose)."""
    steps = wide_steps()
    got = tuning_finals(state, arm, steps)
    choice = tuning.choose(got)
    path = state / fair_verdict.CHOICE_FILE
    path.write_text(json.dumps({
        "arm": arm, "lr": choice.lr, "at_edge": choice.at_edge,
        "two_seed_scores": {f"{lr:g}": score for lr, score in choice.scores.items()},
        "finals": {f"{lr:g}": {str(seed): value for seed, value in by_seed.items()} for lr, by_seed in got.items()},
        "grid": [f"{lr:g}" for lr in choice.grid], "steps": steps,
        "rules": f"instruments/tuning.py at {committed_file(ROOT / 'instruments' / 'tuning.py')}",
    }, indent=1, allow_nan=False) + "\n")
    return path


@dataclass(frozen=True)
class _Tuned:
    runs: list[tuple[float, int]]  # its next runs; empty once it has chosen
    lr: float | None  # its choice
    finished: int  # its finished runs


def _tuned(regime: Path, arm: str, steps: int) -> _Tuned:
    finals = tuning_finals(regime / TUNING / arm_folder(arm), arm, steps)
    runs = tuning.next_runs(finals)
    finished = sum(len(by_seed) for by_seed in finals.values())
    return _Tuned(runs, None if runs else tuning.choose(finals).lr, finished)


def selection_readings(regime: Path, lr: float) -> dict[int, dict[int, cold_start.Reading]]:
    """steps -> seed -> (start, final) of the finished selection runs; refuses one run at a rate other than ``lr``
    (GRPO's choice) or at other steps than its folder's."""
    found: dict[int, dict[int, cold_start.Reading]] = {}
    for path in sorted((regime / COLD_SELECTION).glob(f"steps_*/runs/{arm_folder(REFERENCE)}_seed*/{RESULT}")):
        result = json.loads(path.read_text())
        steps = int(path.parents[2].name.removeprefix("steps_"))
        ran_lr, ran_steps = float(result["settings"]["lr"]), int(result["settings"]["steps"])
        if f"{ran_lr:g}" != f"{lr:g}" or ran_steps != steps:
            raise ValueError(f"{path} ran at lr {ran_lr:g} for {ran_steps} steps; the selection runs GRPO n = 8 at its "
                             f"chosen rate {lr:g} for {steps} steps: move it aside and run the campaign again")
        validation = result["validation"]
        found.setdefault(steps, {})[int(result["spec"]["seed"])] = cold_start.Reading(
            float(validation["0"]), float(validation[str(steps)]))
    return found


def _finished(path: Path) -> bool:
    return path.is_file()


def _cold_rate(regime: Path, arm: str, rates: dict[str, float], grpo: float) -> float:
    """An arm's rate in the cold start: the rate of its finished cold runs, else its own choice (or, for an arm that
    shares another's estimator, that arm's), else GRPO's."""
    started = sorted({float(p.parents[2].name.removeprefix("lr_"))
                      for p in (regime / COLD_ARMS_STATE / arm_folder(arm)).glob(f"lr_*/runs/*/{RESULT}")})
    if len(started) > 1:
        raise ValueError(f"{arm}'s cold runs ran at several rates ({', '.join(f'{lr:g}' for lr in started)}) in "
                         f"{regime / COLD_ARMS_STATE / arm_folder(arm)}: one arm's seeds share one rate")
    if started:
        return started[0]
    return rates.get(fair_verdict.SAME_RATE_AS.get(arm, arm), grpo)


# ------------------------------------------------------------------------------------------------- the plan
def plan(regime: Path = fair_verdict.REGIME) -> Plan:
    """Every run the campaign needs next, in order, from the state under ``regime`` (results/regime/)."""
    steps = wide_steps()
    runs: list[Run] = []
    waiting: list[str] = []
    notes: list[str] = []
    estimated = 0
    tuned = {arm: _tuned(regime, arm, steps) for arm in TUNED_ARMS}
    rates = {arm: t.lr for arm, t in tuned.items() if t.lr is not None}

    def tune(arm: str) -> None:
        nonlocal estimated
        t = tuned[arm]
        runs.extend(Run(TUNING_STAGE, arm, lr, seed, steps, "wide", fair_verdict.WIDE_TEST_FREQ,
                        TUNING / arm_folder(arm) / lr_folder(lr)) for lr, seed in t.runs)
        if t.runs:
            estimated += max(len(t.runs), MIN_TUNING_RUNS - t.finished)
        else:
            notes.append(f"{arm} chose lr {t.lr:g} ({t.finished} tuning runs)")

    def judged(arms: Iterable[str]) -> None:
        nonlocal estimated
        arms = list(arms)
        for arm in arms:
            if arm not in rates:
                waiting.append(f"{arm}'s judged runs at its own rate: for its tuning to choose")
                estimated += len(JUDGED_SEEDS)
            elif _committed(rates[arm]):
                missing = [s for s in JUDGED_SEEDS if not _finished(_committed_result(regime, arm, s))]
                notes.append(f"{arm} chose the committed comparison's rate {rates[arm]:g}: its runs there count, "
                             "nothing is run for it" + (f" (but seeds {missing} are missing there: run at its own "
                                                        "rate)" if missing else ""))
        for seed in JUDGED_SEEDS:
            for arm in arms:
                if arm not in rates:
                    continue
                if _committed(rates[arm]) and _finished(_committed_result(regime, arm, seed)):
                    continue
                run = Run(OWN_STAGE, arm, rates[arm], seed, steps, "wide", fair_verdict.WIDE_TEST_FREQ,
                          OWN_LR / arm_folder(arm) / lr_folder(rates[arm]))
                if not _finished(run.result(regime)):
                    runs.append(run)
                    estimated += 1

    # a. GRPO's tuning
    tune(REFERENCE)
    # b. the cold start's selection, at GRPO's rate
    decision = None
    if REFERENCE not in rates:
        waiting.append(f"the cold start's selection: for {REFERENCE}'s tuning to choose its rate")
        estimated += len(tuning.TUNING_SEEDS)
    else:
        readings = selection_readings(regime, rates[REFERENCE])
        needed = cold_start.next_selection_runs(readings, COLD_STEPS, tuning.TUNING_SEEDS)
        runs.extend(Run(SELECTION_STAGE, REFERENCE, rates[REFERENCE], seed, k, "cold", COLD_TEST_FREQ,
                        COLD_SELECTION / steps_folder(k)) for k, seed in needed)
        estimated += len(needed)
        if not needed:
            decision = cold_start.decide(readings, COLD_STEPS, tuning.TUNING_SEEDS)
            notes.append(f"the cold start's selection: {decision.reason}")
    # c. the other core arms' tuning
    core = [arm for arm in TUNED_ARMS if arm not in (REFERENCE, CUT_FIRST)]
    for arm in core:
        tune(arm)
    # d. the judged runs at the core arms' own rates
    judged([REFERENCE, *core])
    # e. the cold start's arms
    if decision is None:
        waiting.append("the cold start's arms: for the selection to decide")
        estimated += len(COLD_ARMS) * len(JUDGED_SEEDS)
    elif not decision.accepted:
        notes.append("no cold start: its arms are not run (the report says so; no other task is tried)")
    else:
        needs = sorted({fair_verdict.SAME_RATE_AS.get(arm, arm) for arm in COLD_ARMS} & (set(core) - set(rates)))
        if needs:
            waiting.append(f"the cold start's arms: for {', '.join(needs)} to choose")
            estimated += len(COLD_ARMS) * len(JUDGED_SEEDS)
        else:
            k = decision.steps
            lr = {arm: _cold_rate(regime, arm, rates, rates[REFERENCE]) for arm in COLD_ARMS}
            for seed in JUDGED_SEEDS:
                for arm in COLD_ARMS:
                    stop = ROLLOUTS_PER_STEP * k if arm in fair_verdict.STOPPED_AT_ROLLOUTS else None
                    run = Run(COLD_STAGE, arm, lr[arm], seed, k, "cold", COLD_TEST_FREQ,
                              COLD_ARMS_STATE / arm_folder(arm) / lr_folder(lr[arm]), stop)
                    if not _finished(run.result(regime)):
                        runs.append(run)
                        estimated += 1
    # f. BV-Blend n = 8, the first cut
    tune(CUT_FIRST)
    judged([CUT_FIRST])
    return Plan(tuple(runs), tuple(waiting), tuple(notes), estimated)


def _committed(lr: float) -> bool:
    return f"{lr:g}" == f"{fair_verdict.COMMITTED_LR:g}"


def _committed_result(regime: Path, arm: str, seed: int) -> Path:
    return regime / COMMITTED / "runs" / run_folder(arm, seed) / RESULT


# ---------------------------------------------------------------------------------------------- the decisions
def write_decisions(regime: Path = fair_verdict.REGIME) -> list[Path]:
    """Writes what the state has decided and the repository lacks: each finished tuning's ``choice.json``, and the
    selection's ``selection.json`` once it has decided; returns the files written."""
    written = []
    steps = wide_steps()
    for arm in TUNED_ARMS:
        state = regime / TUNING / arm_folder(arm)
        t = _tuned(regime, arm, steps)
        if not t.runs and not (state / fair_verdict.CHOICE_FILE).is_file():
            written.append(write_choice(arm, state))
    grpo = _tuned(regime, REFERENCE, steps).lr
    path = regime / COLD / fair_verdict.SELECTION_FILE
    if grpo is not None and not path.is_file():
        readings = selection_readings(regime, grpo)
        if not cold_start.next_selection_runs(readings, COLD_STEPS, tuning.TUNING_SEEDS):
            written.append(write_selection(path, cold_start.decide(readings, COLD_STEPS, tuning.TUNING_SEEDS),
                                           readings, grpo))
    return written


def write_selection(path: Path, decision: cold_start.Decision, readings: cold_start.Readings, lr: float) -> Path:
    """The selection's decision, its trials and runs, GRPO's rate, and the commit of the rule that decided."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(strict_dumps({
        "accepted": decision.accepted, "steps": decision.steps, "start": decision.start, "final": decision.final,
        "reason": decision.reason, "arm": REFERENCE, "lr": lr, "seeds": list(tuning.TUNING_SEEDS),
        "trials": {str(t.steps): {"start": t.start, "final": t.final, "passed": t.passed,
                                  "runs": {str(seed): {"start": r.start, "final": r.final}
                                           for seed, r in sorted(readings[t.steps].items())}}
                   for t in decision.trials},
        "rule": {"start_max": cold_start.START_MAX, "gain": cold_start.GAIN,
                 "source": f"instruments/cold_start.py at {committed_file(ROOT / 'instruments' / 'cold_start.py')}"},
    }) + "\n")
    return path


# ----------------------------------------------------------------------------------------------- what it says
def describe(p: Plan, out: Path, regime: Path = fair_verdict.REGIME) -> list[str]:
    """``--next``: the runs decided now, in order, what waits and on what, what the state decided, and the first
    run's command."""
    if p.complete:
        return ["[fair verdict] nothing left to run: every run the design needs is in the state", *_listed(p.notes)]
    lines = [f"[fair verdict] {len(p.runs)} run(s) decided now, in the order they run (about {p.estimated} still "
             "needed in all):"]
    lines += [f"  {i:3d}. {run.describe()}  -> {_shown(regime / run.folder)}" for i, run in enumerate(p.runs, 1)]
    if p.waiting:
        lines += ["[fair verdict] not decided yet:", *_listed(p.waiting)]
    if p.notes:
        lines += ["[fair verdict] decided:", *_listed(p.notes)]
    if p.runs:
        command = ["python", _shown(Path(p.runs[0].command(out)[1])), *p.runs[0].command(out)[2:]]
        lines += ["[fair verdict] the first run's command (the runner runs it, then saves its state):",
                  "  " + shlex.join(command)]
    return lines


def _listed(items: Iterable[str]) -> list[str]:
    return [f"  - {item}" for item in items]


def _shown(path: Path) -> str:
    """A path inside the checkout relative to it (as a reader types it), any other as it is."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


__all__ = ["LAUNCHES", "STATE_FOLDERS", "Plan", "Run", "compare_command", "describe", "launches_without_attempt",
           "plan", "read_launches", "record_launch", "selection_readings", "state_command", "tuning_command",
           "tuning_finals", "wide_steps", "write_choice", "write_decisions", "write_selection"]
