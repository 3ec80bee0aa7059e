"""The two history runs of verl's stock trainer on CPU that the end-to-end tests share, and how to replay them.

- **BV-Blend** (``history_level=prompt_and_cluster``, ``rollout.n=4``) with the history-driven prompt sampler, on the
  V1 trainer (verl's default). Its resumed process also carries the engine-death fault ``kill_mid_generation``
  (tests/e2e/engine_faults.py): step 3 trains and is saved, then vLLM's engine core is killed during step 4's
  generation; its first process carries a rollout budget (instruments/cpu/budget_stop.py) that its two steps reach
  exactly, so that the stop counts real steps inside verl's trainer and records them without changing the run.
  test_cpu_trainer.py, test_cpu_history.py and test_cpu_engine_death.py all read this run.
- **SPO** (``adv_estimator=spo``, ``rollout.n=1``) with the sampler, on the legacy trainer (``trainer.use_v1=False``):
  the sampler's one run there. Its resumed process also carries the weight-sync fault ``fail:3``
  (tests/e2e/weight_sync_faults.py): step 3 trains and is saved, then step 4 trains, is saved, and its weight sync
  (the process's third: start-up's, step 3's, step 4's) fails in vLLM's worker (a run of its own until this round).
  test_cpu_history.py and test_cpu_weight_sync.py read it.

Each trains two steps, saves, and a second process resumes from that checkpoint. A prompt's history only matters
when the prompt comes back, so the runs train on 16 distinct prompts of the session's annotated training set, 8 a
step: an epoch is 2 steps, and the resumed steps (epoch 2) revisit prompts. What happened inside the trainer is read
back from what verl itself writes: the "file" logger's JSONL, the rollout dump (``trainer.rollout_data_dir``: each
row's decoded prompt and reward) and the checkpoint folders. The dumped rows are replayed into a fresh verl-free
estimator, keyed by ``prompt_key`` of the dataset's raw prompt whose question the dumped prompt holds: the replay
must give the states the trainer saved, bit for bit (0/1 rewards make every sum exact, and a prompt's update does
not depend on the order of the rows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from bv_blend import BVBlendConfig, BVBlendEstimator
from bv_blend.core.jsonl import jsonl_records
from bv_blend.history.keys import prompt_key
from bv_blend.spo import SPOConfig, SPOEstimator
from instruments.cpu import budget_stop
from instruments.run.verl_run import STOP_FILE
from tests.e2e._assets import CpuAssets, K
from tests.e2e._launch import Fault, Launch, launch
from tests.e2e.engine_faults import FAULT_ENV as ENGINE_FAULT_ENV
from tests.e2e.engine_faults import INJECTED_FAULT as ENGINE_FAULT_MARKER
from tests.e2e.weight_sync_faults import FAULT_ENV as SYNC_FAULT_ENV
from tests.e2e.weight_sync_faults import INJECTED_FAILURE as SYNC_FAULT_MARKER

BATCH = 8  # data.train_batch_size (cpu_tiny's)
TRAIN_PROMPTS = 2 * BATCH  # an epoch is 2 steps: steps 3 and 4 revisit prompts of steps 1-2
FIRST_STEPS = 2
LAST_STEP = FIRST_STEPS + 1  # the last step a resumed process trains, saves and logs
RESUMED_STEPS = LAST_STEP + 1  # what a resumed process is asked for: its fault ends the step after LAST_STEP
SEED = 3  # data.seed: the sampler's draws
ROLLOUT_N = 4  # cpu_tiny's actor_rollout_ref.rollout.n, which the BV-Blend run keeps
# the BV-Blend run's first process stops once it has generated this many rollouts: at the end of its last step, where
# verl stops anyway (the stop's early end is checked on verl's own loop in tests/instruments/cpu/test_budget_stop.py)
FIRST_BUDGET = FIRST_STEPS * BATCH * ROLLOUT_N
STOP_RECORD = STOP_FILE  # where the comparison's runs keep it too
SAMPLER = ("data.history_sampler.enable=true", "data.dataloader_num_workers=0", f"data.seed={SEED}")
SAMPLER_METRICS = ("sampler/weight_entropy", "sampler/p_hat_mean_drawn", "sampler/zero_variance_expected",
                   "sampler/weight_age_steps")  # fmt: skip
# A resumed process's syncs: start-up's, then one after each update (verl saves a step before its sync), so its
# generation of step RESUMED_STEPS follows sync RESUMED_STEPS - FIRST_STEPS, and that step's update the next sync.
MID_GENERATION = Fault("tests.e2e.engine_faults", ENGINE_FAULT_ENV,
                       f"kill_mid_generation:{RESUMED_STEPS - FIRST_STEPS}", ENGINE_FAULT_MARKER)  # fmt: skip
SYNC_AFTER_LAST_RESUMED_STEP = Fault("tests.e2e.weight_sync_faults", SYNC_FAULT_ENV,
                                     f"fail:{RESUMED_STEPS - FIRST_STEPS + 1}", SYNC_FAULT_MARKER)  # fmt: skip


@dataclass(frozen=True)
class Method:
    """One history run: how it is selected, what it writes, and how to replay it."""

    name: str
    overrides: tuple[str, ...]
    trainer: str  # the name of verl's task-runner actor in the log: which trainer ran
    resume_fault: Fault  # strikes in step RESUMED_STEPS, after step LAST_STEP was saved and logged
    state_file: str
    metrics: tuple[str, ...]  # logged at every step
    tracked: str  # the metric counting the prompts in the history
    revisit: str  # the metric of the share of the step's prompts with a history ...
    revisit_is_first_visit: bool  # ... or, when True, of the share without one
    fresh: Callable[[], Any]  # an estimator of the run's options, without history
    from_config: Callable[[Mapping[str, Any]], Any]  # an estimator of a saved config
    feed: Callable[..., Any]  # (estimator, rewards, groups, keys, clusters) -> one call
    prompts: Callable[[Any], Any]  # the estimator's per-prompt table
    first_budget: bool = False  # the first process carries FIRST_BUDGET (the V1 trainer's stop)


BLEND = Method(
    name="bv_blend_prompt_and_cluster",
    overrides=("algorithm.bv_blend.history_level=prompt_and_cluster", *SAMPLER),
    trainer="TaskRunnerV1",
    resume_fault=MID_GENERATION,
    state_file="bv_blend_state.pt",
    metrics=("bv_blend/effective_signal_ratio", "bv_blend/grpo_signal_ratio", "bv_blend/clusters_seen",
             "bv_blend/prompt_weight_mean", "bv_blend/prompt_seen_ratio", "bv_blend/prompts_tracked",
             *SAMPLER_METRICS),  # fmt: skip
    tracked="bv_blend/prompts_tracked",
    revisit="bv_blend/prompt_seen_ratio",
    revisit_is_first_visit=False,
    fresh=lambda: BVBlendEstimator(K, BVBlendConfig(history_level="prompt_and_cluster")),
    from_config=lambda config: BVBlendEstimator(K, BVBlendConfig.from_mapping(config)),
    feed=lambda est, rewards, groups, keys, clusters: est.compute(rewards, groups, clusters, prompt_keys=keys),
    prompts=lambda estimator: estimator.prompts,
    first_budget=True,
)
SPO_LEGACY = Method(
    name="spo_legacy",
    overrides=("algorithm.adv_estimator=spo", "actor_rollout_ref.rollout.n=1", "trainer.use_v1=False", *SAMPLER),
    trainer="TaskRunner",
    resume_fault=SYNC_AFTER_LAST_RESUMED_STEP,
    state_file="spo_state.pt",
    metrics=("spo/p_hat_mean", "spo/n_eff_mean", "spo/first_visit_ratio", "spo/adv_before_norm_mean",
             "spo/adv_std", "spo/prompts_tracked", *SAMPLER_METRICS),  # fmt: skip
    tracked="spo/prompts_tracked",
    revisit="spo/first_visit_ratio",
    revisit_is_first_visit=True,
    fresh=SPOEstimator,
    from_config=lambda config: SPOEstimator(SPOConfig.from_mapping(config)),
    feed=lambda est, rewards, groups, keys, clusters: est.compute(rewards, groups, keys),
    prompts=lambda estimator: estimator.tracker,
)


@dataclass(frozen=True)
class Task:
    """The runs' training prompts: the parquet file, and each question's prompt key and annotated cluster."""

    train_file: Path
    key: dict[str, str]
    cluster: dict[str, int]
    questions: list[str]  # in the file's row order (the dataset's, which the sampler's indices refer to)


@dataclass(frozen=True)
class HistoryRun:
    method: Method
    work: Path
    task: Task
    first: Launch
    second: Launch  # the resumed process

    @property
    def launches(self) -> tuple[Launch, Launch]:
        return self.first, self.second


def history_task(assets: CpuAssets, out_dir: Path) -> Task:
    """The first TRAIN_PROMPTS distinct questions of the shared annotated training set, none inside another (so a
    dumped prompt names exactly one), written as a training file of their own."""
    annotated = next(o.split("=", 1)[1] for o in assets.codebook_overrides if o.startswith("data.train_files="))
    frame = pd.read_parquet(annotated)
    chosen: list[int] = []
    questions: list[str] = []
    for row, extra in enumerate(frame["extra_info"]):
        question = extra["question"]
        if not any(question in q or q in question for q in questions):
            chosen.append(row)
            questions.append(question)
        if len(chosen) == TRAIN_PROMPTS:
            break
    assert len(chosen) == TRAIN_PROMPTS, f"the shared training set has fewer than {TRAIN_PROMPTS} distinct prompts"
    subset = frame.iloc[chosen].reset_index(drop=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    subset.to_parquet(out_dir / "train.parquet")
    # The key the trainer hooks compute from each row's raw_prompt (the dataset's chat messages).
    keys = {extra["question"]: prompt_key(prompt) for prompt, extra in zip(subset["prompt"], subset["extra_info"],
                                                                         strict=True)}  # fmt: skip
    clusters = {extra["question"]: int(extra["bv_blend_cluster"]) for extra in subset["extra_info"]}
    return Task(out_dir / "train.parquet", keys, clusters, [extra["question"] for extra in subset["extra_info"]])


def run_history(method: Method, assets: CpuAssets) -> HistoryRun:
    """Both processes of a history run; each one's exit code is left to the tests to judge."""
    work = assets.work / f"history_{method.name}"
    task = history_task(assets, work)
    common = [
        *assets.overrides,
        *method.overrides,
        f"data.train_files={task.train_file}",
        f"data.train_batch_size={BATCH}",
        "trainer.total_epochs=2",  # the loop ends with the epochs: step 3 is epoch 2's first
        f"trainer.default_local_dir={work / 'checkpoints'}",
        f"++trainer.rollout_data_dir={work / 'rollouts'}",
        "trainer.resume_mode=auto",
        f"trainer.experiment_name=history_{method.name}",
    ]
    run_id = f"e2e-{method.name}-{{}}-{assets.work.name}"
    budget = {budget_stop.STOP_AT_ENV: str(FIRST_BUDGET), budget_stop.RECORD_ENV: str(work / STOP_RECORD)}
    first = launch([*common, f"trainer.total_training_steps={FIRST_STEPS}", f"trainer.save_freq={FIRST_STEPS}"],
                   work / "first.log", work / "first.jsonl", run_id.format("first"),
                   env=budget if method.first_budget else None)  # fmt: skip
    second = launch([*common, f"trainer.total_training_steps={RESUMED_STEPS}", "trainer.save_freq=1"],
                    work / "second.log", work / "second.jsonl", run_id.format("second"), faults=(method.resume_fault,))
    return HistoryRun(method, work, task, first, second)


# ------------------------------------------------------------------------------------------- reading a run back
def rows(work: Path, step: int) -> list[dict]:
    return jsonl_records(work / "rollouts" / f"{step}.jsonl")  # not splitlines(): a U+2028 in an answer is one row


def question_of(prompt: str, task: Task) -> str:
    """The training question inside a dumped (decoded chat) prompt."""
    hits = [q for q in task.key if q in prompt]
    assert len(hits) == 1, f"the dumped prompt {prompt!r} holds {len(hits)} training questions: {hits}"
    return hits[0]


def batch_questions(run: HistoryRun, step: int) -> set[str]:
    return {question_of(row["input"], run.task) for row in rows(run.work, step)}


def saved(run: HistoryRun, step: int) -> dict:
    """The estimator's state the trainer saved in global_step_<step>."""
    path = run.work / "checkpoints" / f"global_step_{step}" / run.method.state_file
    assert path.is_file(), f"no {run.method.state_file} in {path.parent}"
    return torch.load(path, weights_only=True)["estimator"]


def replay(run: HistoryRun, state: Mapping[str, Any] | None, steps: range, config: Mapping[str, Any]) -> Any:
    """Feeds the dumped rows of ``steps`` (reward, prompt group, prompt key, annotated cluster) to a fresh estimator
    of ``config``, started from ``state`` (``None``: no history)."""
    method, task = run.method, run.task
    estimator = method.from_config(config)
    if state is not None:
        estimator.load_state_dict(state)
    for step in steps:
        dumped = rows(run.work, step)
        questions = [question_of(row["input"], task) for row in dumped]
        rewards = torch.tensor([float(row["score"]) for row in dumped])
        # verl's uid is per prompt, and the prompts are distinct: the question identifies the group in a step
        clusters = torch.tensor([task.cluster[q] for q in questions])
        method.feed(estimator, rewards, questions, [task.key[q] for q in questions], clusters)
    return estimator


def canonical(state: Any) -> Any:
    """A saved state as plain values, its prompt tables as {prompt key: column values} (a table lists its prompts in
    the order of their first visit, which follows the order of the batch's rows)."""
    if isinstance(state, Mapping):
        if "keys" in state:
            columns = sorted(name for name in state if name != "keys")
            return {key: tuple(state[c][i].item() for c in columns) for i, key in enumerate(state["keys"])}
        return {name: canonical(value) for name, value in state.items()}
    if isinstance(state, torch.Tensor):
        return state.tolist()
    return state


def assert_same_state(replayed: Mapping[str, Any], saved_state: Mapping[str, Any], what: str) -> None:
    """Equal to the last bit: every entry of the states, each prompt table as a mapping (any order of its rows)."""
    a, b = canonical(replayed), canonical(saved_state)
    differing = {name: (a.get(name), b.get(name)) for name in sorted(a.keys() | b.keys()) if a.get(name) != b.get(name)}
    for name, (mine, theirs) in differing.items():
        if isinstance(mine, dict) and isinstance(theirs, dict):  # a prompt table: only the prompts that differ
            keys = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
            differing[name] = {k: (mine.get(k), theirs.get(k)) for k in keys[:4]}
    assert not differing, f"{what}: the replayed and the saved state differ (replayed, saved): {differing}"
