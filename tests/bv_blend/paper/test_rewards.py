"""The binary Math-Verify reward: a table of (non-)equivalent answers, the timeout, threads, and verl's reward loop."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from bv_blend.paper import rewards
from bv_blend.paper.rewards import (
    Verdict,
    VerifierCrash,
    VerifierPool,
    answer_parses,
    check_answer,
    compute_score,
    get_pool,
    verify_answer,
)
from tests._codebook_helpers import tiny_tokenizer_dir  # noqa: E402

# One worker runs this module's tests in file order, as a single process did before the suite ran on pytest-xdist: the
# tests share the process-wide VerifierPool, whose workers carry state from test to test, and with the tests spread
# over three workers the killed-worker count of test_a_worker_past_the_deadline_is_killed_and_replaced came out 0
# once (fresh-clone run of 9542019).
pytestmark = pytest.mark.xdist_group("rewards")

# An answer whose sympy evaluation never finishes (9^(9^(9^(9^9))) has astronomically many digits).
HANGING = r"The answer is \boxed{9^{9^{9^{9^{9}}}}}"

EQUIVALENT = [
    (r"\boxed{1/2}", "0.5"),
    ("0.5", r"\frac{1}{2}"),
    (r"So the answer is $\boxed{\frac{1}{2}}$.", "1/2"),
    (r"\boxed{\dfrac{3}{4}}", r"\frac34"),
    (r"\boxed{\sqrt{2}/2}", r"\frac{1}{\sqrt{2}}"),
    (r"\boxed{x^2+2x+1}", "(x+1)^2"),
    (r"\boxed{(-\infty, 3]}", r"(-\infty,3]"),
    (r"\boxed{[0,1)}", "[0, 1)"),
    (r"\boxed{2, 3}", "2,3"),
    (r"\boxed{A}", "A"),
    ("Long reasoning about 17 and 4 ... therefore the final answer is \\boxed{21}.", "21"),
]
NOT_EQUIVALENT = [
    (r"\boxed{(-\infty, 3)}", r"(-\infty,3]"),  # open vs closed interval end
    (r"\boxed{3}", "4"),
    (r"\boxed{\frac{1}{3}}", "0.5"),
    (r"\boxed{50\%}", "0.5"),
    (r"\boxed{B}", "A"),
    (r"\boxed{\frac{1}{", "1/2"),  # malformed LaTeX
    ("I do not know.", "7"),  # no answer at all
    (r"\boxed{5} or maybe \boxed{7}", "7"),  # Math-Verify reads several boxes as a set: hedging earns nothing
    ("", "7"),
]


@pytest.mark.parametrize(("prediction", "ground_truth"), EQUIVALENT)
def test_equivalent_answers_verify(prediction, ground_truth):
    assert verify_answer(prediction, ground_truth) is True
    assert compute_score("open-r1/OpenR1-Math-220k", prediction, ground_truth)["score"] == 1.0


@pytest.mark.parametrize(("prediction", "ground_truth"), NOT_EQUIVALENT)
def test_non_equivalent_or_malformed_answers_do_not_verify(prediction, ground_truth):
    assert verify_answer(prediction, ground_truth) is False
    assert compute_score("open-r1/OpenR1-Math-220k", prediction, ground_truth)["score"] == 0.0


def test_a_hanging_answer_scores_zero_within_the_timeout():
    verify_answer("1", "1")  # start a worker first, so only the check is timed
    start = time.perf_counter()
    assert verify_answer(HANGING, "1", timeout_s=3.0) is False
    # the claim is "does not hang": a wide margin, since a loaded 2-core machine stretches any wall-clock figure
    assert time.perf_counter() - start < 3.0 + 30.0
    assert verify_answer(r"\boxed{2}", "2") is True  # the pool still answers


def test_a_worker_past_the_deadline_is_killed_and_replaced():
    """Below math-verify's 1-second alarm granularity only the hard deadline can stop the check."""
    pool = get_pool()
    killed = pool.killed
    assert verify_answer(HANGING, "1", timeout_s=0.5) is False
    assert pool.killed == killed + 1
    assert verify_answer(r"\boxed{1/2}", "0.5") is True


def test_concurrent_calls_from_threads_are_correct_and_a_hang_does_not_block_others():
    cases = EQUIVALENT[:6] + NOT_EQUIVALENT[:5]
    expected = [True] * 6 + [False] * 5
    with ThreadPoolExecutor(max_workers=6) as ex:
        hang = ex.submit(verify_answer, HANGING, "1", 2.0)
        # generous deadlines for the answers that do not hang: the first calls start Math-Verify's worker processes,
        # which on a loaded 2-core machine took over the 5 s default; the hang keeps its short one
        results = list(ex.map(lambda c: verify_answer(*c, timeout_s=60.0), cases))
        assert hang.result() is False
    assert results == expected


def test_a_killed_worker_frees_its_slot_for_a_waiting_thread():
    """With one worker, a thread waiting for it must not block forever when the worker is killed, not returned."""
    pool = VerifierPool(max_workers=1)
    try:
        with ThreadPoolExecutor(max_workers=2) as ex:
            hang = ex.submit(pool.check, HANGING, "1", 0.5)
            time.sleep(0.2)  # let the hanging check take the only slot first
            normal = ex.submit(pool.check, r"\boxed{1/2}", "0.5", 5.0)
            assert hang.result(timeout=120) is False
            assert normal.result(timeout=120) is True
    finally:
        pool.close()


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        verify_answer("1", "1", timeout_s=0)
    with pytest.raises(TypeError, match="must be strings"):
        verify_answer(None, "1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("answer", "ok"), [("1/2", True), ("(0, 1]", True), ("x=3", True), ("\\frac{1}{", False), ("", False)]
)
def test_answer_parses_rejects_malformed_reference_answers(answer, ok):
    assert answer_parses(answer) is ok


def test_the_environment_sets_every_checks_timeout_and_a_bad_value_is_a_clear_error(monkeypatch):
    """BV_BLEND_REWARD_TIMEOUT_S reaches the evaluation's checks as well as the reward: 0.5 s, below math-verify's
    1-second alarm, ends the hanging check only by the pool's kill (the default 5 s would end it by the alarm)."""
    pool = get_pool()
    killed = pool.killed
    monkeypatch.setenv(rewards.TIMEOUT_ENV, "0.5")
    assert verify_answer(HANGING, "1") is False and pool.killed == killed + 1
    for bad, message in [("soon", "is not a number of seconds"), ("0", "must be positive")]:
        monkeypatch.setenv(rewards.TIMEOUT_ENV, bad)
        assert verify_answer("so \\boxed{9}", "9", timeout_s=30) is True  # an argument: the variable is not read
        with pytest.raises(ValueError, match=message):
            verify_answer("1", "1")
        with pytest.raises(ValueError, match=message):
            answer_parses("1")
    monkeypatch.delenv(rewards.TIMEOUT_ENV)
    assert rewards.resolve_timeout(None) == rewards.DEFAULT_TIMEOUT_S


def test_compute_score_reads_the_timeout_from_extra_info():
    """0.5 s is below math-verify's 1-second alarm, so only the pool's hard deadline ends the check and the worker is
    killed; at the default 5 s math-verify's own alarm would end it first (no kill). The kill shows 0.5 was read."""
    pool = get_pool()
    killed = pool.killed
    scored = compute_score("x", HANGING, "1", extra_info={"math_verify_timeout_s": 0.5})
    assert scored["score"] == 0.0 and scored["verifier_failure"] == 1.0
    assert pool.killed == killed + 1


@pytest.mark.parametrize("path_form", ["pkg", "file"])
def test_verl_loads_compute_score_as_a_custom_reward_function(path_form):
    """verl's own loader, with the module given as pkg:// and as a file path (loaded under another name)."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    paths = {"pkg": "pkg://bv_blend.paper.rewards", "file": rewards.__file__}
    path = paths[path_form]
    config = OmegaConf.create(
        {"reward": {"custom_reward_function": {"path": path, "name": "compute_score", "reward_kwargs": {}}}}
    )
    fn = get_custom_reward_fn(config)
    assert fn(data_source="d", solution_str=r"\boxed{\frac{2}{4}}", ground_truth="0.5", extra_info={})["score"] == 1.0
    assert fn(data_source="d", solution_str=r"\boxed{3}", ground_truth="0.5", extra_info={})["score"] == 0.0


def test_verl_naive_reward_manager_scores_decoded_responses(tmp_path):
    """verl's reward-loop NaiveRewardManager decodes the response and calls compute_score from an executor thread."""
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir(tmp_path / "tok")))
    manager = NaiveRewardManager(OmegaConf.create({}), tokenizer, compute_score)
    scores, extras = [], []
    for response, truth in [(r"Thus \boxed{1/2}.", "0.5"), (r"Thus \boxed{2}.", "0.5")]:
        ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        prompt = tokenizer("Q:", add_special_tokens=False)["input_ids"]
        data = DataProto.from_dict(
            tensors={
                "prompts": torch.tensor([prompt]),
                "responses": torch.tensor([ids]),
                "attention_mask": torch.ones(1, len(prompt) + len(ids), dtype=torch.long),
            },
            non_tensors={
                "data_source": np.array(["open-r1/OpenR1-Math-220k"], dtype=object),
                "reward_model": np.array([{"style": "rule", "ground_truth": truth}], dtype=object),
                "extra_info": np.array([{}], dtype=object),
            },
        )
        result = manager.loop.run_until_complete(manager.run_single(data))
        scores.append(result["reward_score"])
        extras.append(result["reward_extra_info"])
    assert scores == [1.0, 0.0]
    # every key of the returned dict rides in verl's reward_extra_info (acc as verl sets it for a float reward)
    assert extras == [{"score": 1.0, "acc": 1.0, "verifier_failure": 0.0},
                      {"score": 0.0, "acc": 0.0, "verifier_failure": 0.0}]  # fmt: skip


# ------------------------------------------------------------------------ verifier failures (issue 37, point 4)
def test_a_verifier_timeout_scores_zero_and_is_counted():
    """math-verify's own timeout (its 1 s alarm) and the hard deadline's kill are verifier failures: score 0 with
    verifier_failure 1. A wrong or unparsable answer is not a failure of the verifier."""
    timed_out = compute_score("x", HANGING, "1", extra_info={"math_verify_timeout_s": 1.5})
    assert timed_out == {"score": 0.0, "acc": 0.0, "verifier_failure": 1.0}
    assert check_answer(HANGING, "1", timeout_s=0.5) == Verdict(False, failure=True)  # killed past the deadline
    for prediction, truth in [(r"\boxed{3}", "4"), ("I do not know.", "7"), (r"\boxed{\frac{1}{", "1/2")]:
        assert compute_score("x", prediction, truth)["verifier_failure"] == 0.0
    assert compute_score("x", r"\boxed{1/2}", "0.5") == {"score": 1.0, "acc": 1.0, "verifier_failure": 0.0}


def test_a_programming_error_in_a_check_is_raised_not_scored_zero():
    """An exception math-verify did not raise on an answer (here a malformed request: TypeError in our worker's own
    call; an unknown operation: KeyError) reaches the caller with the worker's traceback; the pool still answers."""
    pool = get_pool()
    with pytest.raises(VerifierCrash, match=r"raised TypeError: .*missing 1 required positional argument"):
        pool._run(["verify", r"\boxed{1}", "1"], 30.0)
    with pytest.raises(VerifierCrash, match=r"raised KeyError"):
        pool._run(["simplify", "1"], 30.0)
    assert verify_answer(r"\boxed{1/2}", "0.5") is True


def test_verls_legacy_step_metrics_count_the_verifier_failures():
    """verl's legacy fit puts reward_extra_info into the batch's non_tensor_batch; verl's own compute_data_metrics
    (patched by the plugin) sums verifier_failure into reward/verifier_failures, for any estimator."""
    from verl.trainer.ppo import ray_trainer

    from tests.bv_blend.verl._companion_helpers import group_batch

    data = group_batch([[1, 0], [0, 0]], prefix="r", seed=0)
    data = ray_trainer.compute_advantage(data, adv_estimator="grpo", num_repeat=2)
    mask = data.batch["response_mask"]
    data.batch["responses"] = torch.ones_like(mask)
    data.batch["prompts"] = torch.ones_like(mask)
    data.batch["attention_mask"] = torch.cat([torch.ones_like(mask), mask], dim=1)
    data.non_tensor_batch["verifier_failure"] = np.array([1.0, 0.0, 1.0, 0.0], dtype=object)
    metrics = ray_trainer.compute_data_metrics(batch=data, use_critic=False)
    assert metrics["reward/verifier_failures"] == 2.0
    del data.non_tensor_batch["verifier_failure"]  # another reward: no such metric
    assert "reward/verifier_failures" not in ray_trainer.compute_data_metrics(batch=data, use_critic=False)
