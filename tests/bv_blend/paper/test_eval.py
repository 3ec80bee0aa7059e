"""The evaluation suite on canned model outputs: extraction, option permutation, avg@k / pass@1, the table.

Generation needs vLLM on a GPU; here a canned generator stands in for it (``canned_vllm_stand_in``).
Maths answers are judged by the real Math-Verify (bv_blend.paper.rewards.verify_answer).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from bv_blend.paper.eval import (
    BENCHMARKS,
    avg_at_k,
    build_request,
    evaluate,
    extract_boxed,
    extract_choice,
    judge,
    load_problems,
    load_scores,
    mean_pass_at_k,
    pass_at_k,
    permute_options,
    results_table,
    save_scores,
    self_check,
    self_check_table,
    to_markdown,
    write_table,
)
from bv_blend.paper.eval.benchmarks import Problem, parse_benchmark_args
from tests._scripts import load_script


@pytest.fixture(autouse=True)
def unhurried_checks(monkeypatch):
    """These tests check the grader's verdicts, not its timing: on a machine busy with another training run two of
    them timed out at the default 5 s and scored a right answer 0. The timeout itself: tests/test_rewards.py."""
    from bv_blend.paper.rewards import TIMEOUT_ENV

    monkeypatch.setenv(TIMEOUT_ENV, "60")

# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("first \\boxed{3}, then corrected: \\boxed{ {4}^{2} }", "{4}^{2}"),
        ("\\boxed{\\left\\{ 1, 2 \\right\\}}", "\\left\\{ 1, 2 \\right\\}"),
        ("the answer is \\boxed 7.", "7."),
        ("\\fbox{12}", "12"),
        ("good \\boxed{5} then a broken \\boxed{6", "5"),
        ("no box here, answer 5", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Reasoning... so the answer is (B).", "B"),
        ("Answer: C", "C"),
        ("**Answer:** (A)", "A"),
        ("Thus the answer is D", "D"),
        ("The correct answer is: option B", "B"),
        ("I considered (A) but (C) fits.", "C"),
        ("First I thought the answer is A. Re-checking, the answer is (D).", "D"),
        ("... so \\boxed{C}", "C"),
        ("... so \\boxed{\\text{(B)}}", "B"),
        ("B", "B"),
        ("Answer: E", None),  # only four options
        ("So the answer is a multiple of 3, namely (B).", "B"),  # "a" is a word, not option A
        ("We answer a simpler question first.", None),
        ("I cannot tell.", None),
    ],
)
def test_extract_choice(text, expected):
    assert extract_choice(text, num_options=4) == expected


def test_extract_choice_reads_letters_beyond_d_for_ten_options():
    assert extract_choice("the answer is (J)", num_options=10) == "J"


# ---------------------------------------------------------------- option permutation


def test_permutation_is_seeded_and_remaps_the_gold_letter():
    options = ["red", "green", "blue", "black"]
    shuffled, gold, order = permute_options(options, gold_index=2, seed=7, key="q1")
    assert shuffled[gold] == "blue" and sorted(shuffled) == sorted(options)
    assert [options[i] for i in order] == shuffled
    assert permute_options(options, 2, seed=7, key="q1") == (shuffled, gold, order)
    others = {tuple(permute_options(options, 2, seed=s, key="q1")[0]) for s in range(20)}
    assert len(others) > 5  # the seed matters


def test_permutation_spreads_the_gold_position_evenly():
    positions = Counter(permute_options(list("abcd"), 0, seed=0, key=f"q{i}")[1] for i in range(800))
    assert set(positions) == {0, 1, 2, 3}
    assert all(150 <= count <= 250 for count in positions.values()), positions


def test_permutation_rejects_a_gold_index_outside_the_options():
    with pytest.raises(ValueError, match="outside the 3 options"):
        permute_options(["a", "b", "c"], gold_index=3, seed=0, key="q")


# ---------------------------------------------------------------- metrics


def test_pass_at_k_and_avg_at_k_arithmetic():
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)
    assert pass_at_k(4, 3, 2) == 1.0
    assert mean_pass_at_k([[True], [False], [True], [True]]) == 0.75
    assert avg_at_k([[True, False, False, True], [True] * 4], k=4) == pytest.approx((0.5 + 1.0) / 2)
    with pytest.raises(ValueError, match="avg@4 needs 4 samples"):
        avg_at_k([[True, False, True]], k=4)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


# ---------------------------------------------------------------- loading the nine formats


def _write(tmp_path, name, rows, fmt):
    path = tmp_path / f"{name}.{fmt}"
    if fmt == "parquet":
        pd.DataFrame(rows).to_parquet(path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


CANNED_ROWS = {
    "amc": [{"id": 1, "problem": "What is 70+72?", "answer": 142.0}, {"id": 2, "problem": "2+3?", "answer": 5.0}],
    "math500": [
        {"unique_id": "a", "problem": "Simplify 2/4.", "answer": "\\frac{1}{2}"},
        {"unique_id": "b", "problem": "What is 3^2?", "answer": "9"},
    ],
    "minerva": [{"question": "Compute 6*7.", "answer": "42"}],
    "aime24": [{"id": 60, "problem": "Find 1+1.", "answer": "2"}],
    "aime25": [{"problem": "Find 2+2.", "answer": "4"}],
    "olympiadbench": [{"id": 7, "question": "Find 10-3.", "final_answer": ["7"]}],
    "arc_c": [
        {"id": "arc1", "question": "Which is a mammal?",
         "choices": {"text": ["trout", "whale", "shark", "eel"], "label": ["1", "2", "3", "4"]}, "answerKey": "2"},
    ],
    "gpqa_diamond": [
        {"Record ID": "g1", "Question": "Which particle is a lepton?", "Correct Answer": "electron",
         "Incorrect Answer 1": "proton", "Incorrect Answer 2": "neutron", "Incorrect Answer 3": "pion"},
    ],
    "mmlu_pro": [
        {"question_id": 11, "question": "Capital of France?",
         "options": ["Berlin", "Madrid", "Paris", "Rome", "Oslo", "Bern", "Vienna", "Lisbon", "Dublin", "Prague"],
         "answer": "C"},
    ],
}
GOLD = {"amc": ["142", "5"], "math500": ["\\frac{1}{2}", "9"], "minerva": ["42"], "aime24": ["2"],
        "aime25": ["4"], "olympiadbench": ["7"], "arc_c": "whale", "gpqa_diamond": "electron",
        "mmlu_pro": "Paris"}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_load_problems_reads_each_benchmarks_default_fields(tmp_path, fmt):
    for name, rows in CANNED_ROWS.items():
        problems = load_problems(BENCHMARKS[name], _write(tmp_path, name, rows, fmt))
        assert len(problems) == len(rows)
        if BENCHMARKS[name].kind == "math":
            assert [p.answer for p in problems] == GOLD[name]
        else:
            assert problems[0].options[problems[0].gold_index] == GOLD[name]


def test_load_problems_names_missing_columns_and_the_fix(tmp_path):
    path = _write(tmp_path, "m", [{"prompt": "x", "answer": "1"}], "jsonl")
    with pytest.raises(ValueError, match=r"lacks the question column\(s\) \(tried \{'question': \['problem', "
                       r"'question'\]\}\); it has \['prompt', 'answer'\]\. Map a column with --field math500"):
        load_problems(BENCHMARKS["math500"], path)
    renamed = BENCHMARKS["math500"].with_fields(question_field="prompt")
    assert load_problems(renamed, path)[0].question == "x"


# ---------------------------------------------------------------- the whole suite on canned outputs


def canned_vllm_stand_in(correct_plan):
    """Stands in for vLLM (needs a GPU): answers each prompt right or wrong per ``correct_plan[prompt]``."""

    def generate(conversations, n):
        out = []
        for conv in conversations:
            prompt = conv[0]["content"]
            plan, right, wrong = correct_plan[prompt]
            assert len(plan) == n
            out.append([right if ok else wrong for ok in plan])
        return out

    return generate


def test_evaluate_scores_canned_outputs_with_math_verify(tmp_path):
    math500 = BENCHMARKS["math500"].with_samples(32)
    minerva = BENCHMARKS["minerva"]
    gpqa = BENCHMARKS["gpqa_diamond"]
    problems = {
        "math500": (math500, [Problem("a", "Simplify 2/4.", answer="\\frac{1}{2}"), Problem("b", "3^2?", answer="9")]),
        "minerva": (minerva, [Problem("m1", "6*7?", answer="42"), Problem("m2", "1+1?", answer="2")]),
        "gpqa_diamond": (gpqa, [Problem(f"g{i}", f"Q{i}", options=("yes", "no", "maybe", "never"), gold_index=0)
                                for i in range(4)]),
    }
    plan = {}
    # math500 (avg@32): 8/32 right on a (as 0.5, which Math-Verify equates with 1/2), 32/32 on b.
    req_a, req_b = (build_request(math500, p, seed=0) for p in problems["math500"][1])
    plan[req_a.prompt] = ([i < 8 for i in range(32)], "so \\boxed{0.5}", "so \\boxed{\\frac{1}{3}}")
    plan[req_b.prompt] = ([True] * 32, "We get $\\boxed{9}$.", "\\boxed{8}")
    # minerva (pass@1): one right, one wrong.
    req_m1, req_m2 = (build_request(minerva, p, seed=0) for p in problems["minerva"][1])
    plan[req_m1.prompt] = ([True], "\\boxed{42}", "\\boxed{41}")
    plan[req_m2.prompt] = ([False], "\\boxed{2}", "\\boxed{3}")
    # gpqa (pass@1, permuted options): answer the letter where "yes" landed on 3 of 4 problems.
    for i, problem in enumerate(problems["gpqa_diamond"][1]):
        request = build_request(gpqa, problem, seed=0)
        where = re.search(r"^([A-D])\. yes$", request.prompt, flags=re.MULTILINE).group(1)
        assert where == request.gold
        wrong = next(letter for letter in "ABCD" if letter != where)
        plan[request.prompt] = ([i < 3], f"The answer is ({where}).", f"Answer: {wrong}")

    results = evaluate(problems, canned_vllm_stand_in(plan), seed=0, out_dir=tmp_path)
    assert results["math500"].metric == "avg@32"
    assert results["math500"].score == pytest.approx((8 / 32 + 1.0) / 2)
    assert results["minerva"].score == 0.5 and results["minerva"].metric == "pass@1"
    assert results["gpqa_diamond"].score == 0.75
    lines = (tmp_path / "math500.samples.jsonl").read_text().splitlines()
    assert len(lines) == 64 and json.loads(lines[0])["extracted"] == "0.5"

    save_scores(tmp_path / "scores.json", "bv_blend", results, {"temperature": 0.6})
    run, scores = load_scores(tmp_path / "scores.json")
    assert run == "bv_blend" and scores["gpqa_diamond"] == 0.75


def test_choice_gold_positions_vary_across_problems():
    gpqa = BENCHMARKS["gpqa_diamond"]
    golds = {build_request(gpqa, Problem(f"g{i}", "Q", options=("a", "b", "c", "d"), gold_index=0), 0).gold
             for i in range(40)}
    assert golds == set("ABCD")  # without the permutation GPQA's gold would always be A


# ---------------------------------------------------------------- the table


def test_results_table_layout_means_and_files(tmp_path):
    full = {b: 0.5 for b in BENCHMARKS} | {"amc": 0.6, "mmlu_pro": 0.2}
    table = results_table({"bv_blend": full, "grpo": {b: 0.4 for b in BENCHMARKS if b != "arc_c"}})
    assert list(table.columns) == [
        "AMC", "MATH-500", "Minerva", "AIME 2024", "AIME 2025", "OlympiadBench", "ID avg",
        "ARC-C", "GPQA-Diamond", "MMLU-Pro", "OOD avg",
    ]
    assert table.loc["bv_blend", "ID avg"] == pytest.approx((60 + 50 * 5) / 6)
    assert table.loc["bv_blend", "OOD avg"] == pytest.approx((50 + 50 + 20) / 3)
    assert table.loc["grpo", "ID avg"] == pytest.approx(40.0)
    assert math.isnan(table.loc["grpo", "ARC-C"]) and math.isnan(table.loc["grpo", "OOD avg"])

    markdown = to_markdown(table)
    assert markdown.splitlines()[0].startswith("| run | AMC | MATH-500")
    assert "| bv_blend | 60.0 | 50.0" in markdown and "| grpo |" in markdown and " - |" in markdown
    md, csv = write_table(table, tmp_path / "results")
    assert md.read_text() == markdown
    back = pd.read_csv(csv, index_col="run")
    assert back.loc["bv_blend", "OOD avg"] == pytest.approx(40.0)


def test_results_table_rejects_unknown_benchmarks():
    with pytest.raises(ValueError, match="Unknown benchmark"):
        results_table({"run": {"gsm8k": 0.9}})


# ---------------------------------------------------------------- command line


def test_evaluate_script_table_and_to_verl(tmp_path, capsys):
    from bv_blend.paper.rewards import compute_score

    script = load_script("evaluate")
    for run, value in (("bv_blend", 0.5), ("grpo", 0.4)):
        payload = {"run": run, "settings": {}, "scores": {b: {"score": value} for b in BENCHMARKS}}
        (tmp_path / f"{run}.json").write_text(json.dumps(payload))
    argv = ["table", "--scores", str(tmp_path / "bv_blend.json"), str(tmp_path / "grpo.json"),
            "--out", str(tmp_path / "t")]
    assert script.main(argv) == 0
    assert "| grpo | 40.0 |" in (tmp_path / "t.md").read_text() and (tmp_path / "t.csv").is_file()

    source = _write(tmp_path, "math500", CANNED_ROWS["math500"], "jsonl")
    out = tmp_path / "val" / "math500.parquet"
    assert script.main(["to-verl", "--bench", f"math500={source}", "--out", str(out)]) == 0
    rows = pd.read_parquet(out).to_dict("records")
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["\\frac{1}{2}", "9"]
    assert rows[0]["prompt"][0]["role"] == "user" and "\\boxed{}" in rows[0]["prompt"][0]["content"]
    truth = rows[1]["reward_model"]["ground_truth"]
    assert compute_score(rows[1]["data_source"], "so \\boxed{9}", truth)["score"] == 1.0
    gpqa = _write(tmp_path, "gpqa", CANNED_ROWS["gpqa_diamond"], "jsonl")
    capsys.readouterr()
    assert script.main(["to-verl", "--bench", f"gpqa_diamond={gpqa}", "--out", str(out)]) == 2
    assert "multiple choice" in capsys.readouterr().err
    assert script.main(["run", "--model", str(tmp_path), "--run-name", "x", "--bench", "nope=x"]) == 2
    assert "Unknown benchmark 'nope'" in capsys.readouterr().err


# ---------------------------------------------------------------- the files as published (tests/fixtures/benchmarks)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "benchmarks"

PUBLISHED = [
    # (benchmark, file(s), ids, answers or gold option texts, has reference solutions)
    ("math500", ["math500.jsonl"], ["test/prealgebra/1.json", "test/precalculus/2.json", "test/algebra/3.json"],
     ["\\frac{1}{2}", "\\left( 2, \\frac{\\pi}{2} \\right)", "9"], True),
    ("aime24", ["aime24.parquet"], ["60", "61"], ["24", "9"], True),
    ("aime24", ["aime24_maxwell.jsonl"], ["2024-I-1", "2024-I-2"], ["35", "99"], True),
    ("aime25", ["aime2025-I.jsonl", "aime2025-II.jsonl"], ["aime2025-I/0", "aime2025-I/1", "aime2025-II/0"],
     ["42", "32", "81"], False),
    ("amc", ["amc.parquet"], ["0", "1"], ["142", "0.25"], False),
    ("amc", ["amc23.jsonl"], ["0", "1"], ["27", "36"], False),
    # Minerva-Math as Qwen2.5-Math ships it: the answer is the solution's LAST \boxed{}, nested braces kept
    ("minerva", ["minerva_math.jsonl"], ["0", "1", "2"], ["1.6", "\\frac{1}{2}", "7.5 \\times 10^{-3}"], True),
    ("minerva", ["minervamath.jsonl"], ["0", "1"], ["1.6", "\\frac{1}{2}"], False),
    ("olympiadbench", ["olympiadbench.jsonl"], ["1606", "1607"], ["8", "-2, 2"], True),
    ("arc_c", ["arc_c.parquet"], ["Mercury_1", "Mercury_2"], ["whale", "oxygen"], False),
    ("gpqa_diamond", ["gpqa_diamond.csv"], ["recA1", "recB2", "recC3"], ["electron", "10^-3", "mitochondrion"],
     False),
    ("mmlu_pro", ["mmlu_pro.parquet"], ["70"], ["Paris"], False),
]


@pytest.mark.parametrize(("name", "files", "ids", "golds", "solutions"), PUBLISHED,
                         ids=[f"{p[0]}:{p[1][0]}" for p in PUBLISHED])
def test_each_benchmark_loads_as_published(name, files, ids, golds, solutions):
    bench = BENCHMARKS[name]
    problems = load_problems(bench, [FIXTURES / f for f in files])
    assert [p.id for p in problems] == ids
    if bench.kind == "math":
        assert [p.answer for p in problems] == golds
    else:
        assert [p.options[p.gold_index] for p in problems] == golds
    assert all(p.question and "\n" not in p.question[-1:] for p in problems)
    assert all(bool(p.solution) for p in problems) is solutions


def test_gpqa_csv_keeps_commas_quotes_and_all_four_options():
    problems = load_problems(BENCHMARKS["gpqa_diamond"], FIXTURES / "gpqa_diamond.csv")
    assert problems[1].question == 'A solution has pH 3. What is [H+], in mol/L, "approximately"?'
    assert problems[2].options == ("mitochondrion", "ribosome", "Golgi apparatus, in part", "lysosome")
    assert {len(p.options) for p in problems} == {4} and {p.gold_index for p in problems} == {0}


def test_gpqa_options_are_shuffled_per_question_with_the_seed_and_scored_by_letter():
    gpqa = BENCHMARKS["gpqa_diamond"]
    problem = load_problems(gpqa, FIXTURES / "gpqa_diamond.csv")[2]
    first, again = build_request(gpqa, problem, seed=3), build_request(gpqa, problem, seed=3)
    assert first == again  # deterministic per (seed, question id)
    listed = re.findall(r"^([A-D])\. (.+)$", first.prompt, flags=re.MULTILINE)
    assert sorted(text for _, text in listed) == sorted(problem.options)
    assert dict(listed)[first.gold] == "mitochondrion"  # the gold letter follows the shuffle
    golds = {build_request(gpqa, problem, seed=s).gold for s in range(30)}
    assert len(golds) > 1  # another seed, another order
    wrong = next(letter for letter in "ABCD" if letter != first.gold)
    assert judge(gpqa, first, f"... so the answer is \\boxed{{{first.gold}}}") == (first.gold, True)
    assert judge(gpqa, first, f"ANSWER: {wrong}") == (wrong, False)


def test_several_files_and_unique_ids(tmp_path):
    with pytest.raises(ValueError, match=r"ids \['7'\] occur more than once; pass --field aime24.id_field="):
        load_problems(BENCHMARKS["aime24"], _write(tmp_path, "dup", [{"id": 7, "problem": "a", "answer": "1"}] * 2,
                                                   "jsonl"))
    numbered = BENCHMARKS["aime24"].with_fields(id_field="")
    assert [p.id for p in load_problems(numbered, tmp_path / "dup.jsonl")] == ["0", "1"]


@pytest.mark.parametrize(
    ("rows", "name", "match"),
    [
        ([{"problem": "x", "solution": "no box here"}], "minerva", r"problem 0: no reference answer and no \\boxed"),
        ([{"Question": "q", "Correct Answer": "a", "Incorrect Answer 1": "b"}], "gpqa_diamond",
         r"lacks the incorrect \('Incorrect Answer 2'\), incorrect \('Incorrect Answer 3'\) column"),
    ],
)
def test_unusable_rows_are_clear_errors(tmp_path, rows, name, match):
    with pytest.raises(ValueError, match=match):
        load_problems(BENCHMARKS[name], _write(tmp_path, name, rows, "jsonl"))


def test_unsupported_or_unreadable_files_are_clear_errors(tmp_path):
    (tmp_path / "x.txt").write_text("problem,answer\n")
    with pytest.raises(ValueError, match=r"unsupported file type '\.txt'; use \.parquet, \.jsonl, \.json or \.csv"):
        load_problems(BENCHMARKS["math500"], tmp_path / "x.txt")
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="is not a readable parquet file"):
        load_problems(BENCHMARKS["math500"], tmp_path / "x.parquet")


def test_avg_at_k_defaults_follow_the_papers_lineage_and_are_configurable():
    assert {n: b.metric for n, b in BENCHMARKS.items()} == {
        "amc": "avg@32", "math500": "pass@1", "minerva": "pass@1", "aime24": "avg@32", "aime25": "avg@32",
        "olympiadbench": "pass@1", "arc_c": "pass@1", "gpqa_diamond": "pass@1", "mmlu_pro": "pass@1",
    }
    chosen = parse_benchmark_args(["math500=a.jsonl", "aime24=b.parquet"], samples=["math500=16", "aime24=1"])
    assert chosen["math500"][0].metric == "avg@16" and chosen["aime24"][0].metric == "pass@1"
    for bad, match in ((["math500=0"], "positive integer"), (["math500=x"], "K must be an integer"),
                       (["gsm8k=4"], "NAME=K for a --bench benchmark")):
        with pytest.raises(ValueError, match=match):
            parse_benchmark_args(["math500=a.jsonl"], samples=bad)
    two = parse_benchmark_args(["aime25=I.jsonl,II.jsonl"])
    assert [p.name for p in two["aime25"][1]] == ["I.jsonl", "II.jsonl"]
    with pytest.raises(ValueError, match="given twice"):
        parse_benchmark_args(["aime25=I.jsonl", "aime25=II.jsonl"])


# ---------------------------------------------------------------- the grader's self-check


def test_self_check_on_the_published_layouts():
    """The references in the fixtures are right; the grader accepts them, except where Math-Verify reads the text
    differently: the Minerva solution "First guess \\boxed{2}, then correct it. The width is \\boxed{1.6}." is
    read as the set {2, 1.6} by Math-Verify 0.9 (and scores 0 against 1.6), as a model's response would be."""
    results = {}
    for name, files, *_ in PUBLISHED:
        bench = BENCHMARKS[name]
        results[f"{name}:{files[0]}"] = self_check(bench, load_problems(bench, [FIXTURES / f for f in files]))
    for key, result in results.items():
        assert result.accuracy("answer") == 1.0, (key, result.failures)
    rejected = {(r.benchmark, f["id"], f["check"]) for r in results.values() for f in r.failures}
    assert rejected == {("minerva", "0", "solution")}
    minerva = results["minerva:minerva_math.jsonl"]
    assert minerva.graded == {"answer": 3, "solution": 3} and minerva.accepted == {"answer": 3, "solution": 2}
    assert minerva.failures[0]["last_boxed"] == "1.6"
    table = self_check_table(list(results.values()))
    assert "| minerva | 3 | 3/3 (100.0%) | 2/3 (66.7%) |" in table
    assert "| gpqa_diamond | 3 | 3/3 (100.0%) | - |" in table


def test_self_check_reports_answers_the_grader_cannot_match(tmp_path):
    rows = [{"unique_id": "ok", "problem": "p", "answer": "9", "solution": "So \\boxed{9}."},
            {"unique_id": "broken", "problem": "p", "answer": "\\frac{1}{", "solution": "So \\boxed{3}."},
            {"unique_id": "wrong", "problem": "p", "answer": "4", "solution": "So \\boxed{5}."}]
    result = self_check(BENCHMARKS["math500"], load_problems(BENCHMARKS["math500"], _write(tmp_path, "m", rows,
                                                                                           "jsonl")))
    assert result.accuracy("answer") == pytest.approx(2 / 3) and result.accuracy("solution") == pytest.approx(1 / 3)
    assert {(f["id"], f["check"]) for f in result.failures} == {("broken", "answer"), ("broken", "solution"),
                                                               ("wrong", "solution")}


def test_evaluate_script_self_check_and_context_check(tmp_path, capsys):
    script = load_script("evaluate")
    out = tmp_path / "rejected.jsonl"
    argv = ["self-check", "--bench", f"minerva={FIXTURES / 'minerva_math.jsonl'}",
            "--bench", f"gpqa_diamond={FIXTURES / 'gpqa_diamond.csv'}", "--out", str(out)]
    assert script.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| minerva | 3 | 3/3 (100.0%) | 2/3 (66.7%) |" in printed
    assert "rejected: minerva 0 (solution): gold '1.6', last \\boxed{} '1.6'" in printed
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["0"]

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    run = ["run", "--model", str(model), "--run-name", "x", "--bench", f"math500={FIXTURES / 'math500.jsonl'}"]
    assert script.main([*run, "--max-tokens", "8192"]) == 2
    assert "--max-tokens 8192 leaves no room for the prompt in the 4096-token context" in capsys.readouterr().err
    assert script.main([*run, "--max-model-len", "16384"]) == 2
    assert "--max-model-len 16384 exceeds the model's context of 4096 tokens" in capsys.readouterr().err


def test_benchmark_fixture_files_are_what_the_generator_writes(tmp_path):
    from tests.fixtures.make_fixtures import write_all

    for path in write_all(tmp_path):
        if path.parent.name != "benchmarks":
            continue
        committed = FIXTURES / path.name
        if path.suffix == ".parquet":
            assert pq.read_table(path).equals(pq.read_table(committed)), f"{path.name}: rerun make_fixtures.py"
        else:
            assert path.read_text() == committed.read_text(), f"{path.name}: rerun tests/fixtures/make_fixtures.py"
