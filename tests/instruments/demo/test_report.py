"""The demo's report through its real code on run folders in verl's formats: a committed comparison run of the demo's
arm that learned, the same run made flat, and one that fell, reach both verdicts; inputs that cannot show a gain, and
a comparison file that cannot be read, are refused with the fix.

The committed runs keep verl's metrics log (results/regime/pretrained_lm_runs/comparison/runs/*/metrics.jsonl: the
pass rate per family at each validation, the training steps' metrics) but not its validation dump (a row per
response). The dump is written here with exactly the right answers per family that verl logged, on the committed
held-out prompts, each prompt all right or all wrong (but one): the widest spread over prompts those counts allow,
and at the start on the prompts the end gets wrong, where counts allow, so that the pairing cannot narrow the gain's
interval. The report refuses a dump that disagrees with the log, so the numbers below are the committed run's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from instruments import regime
from instruments.demo import pipeline
from instruments.demo import report as demo_report
from instruments.run import report as run_report
from instruments.stats import Interval

COMPARISON = regime.SUMMARY_DIR / "pretrained_lm_runs" / "comparison"
LEARNED_RUN = COMPARISON / "runs" / "bv_blend_n2_seed2"  # the demo's arm, a seed whose metrics log is committed
HELD_OUT = COMPARISON / "prepared" / "task" / "val.parquet"  # the held-out prompts every run of it validated on


def held_out_questions() -> dict[str, str]:
    """question -> family of the comparison's held-out prompts, as prepare reads them for verl's dump."""
    infos = pd.read_parquet(HELD_OUT, columns=["extra_info"])["extra_info"]
    return {info["question"]: info["family"] for info in infos}


def committed_metrics() -> list[dict]:
    return [json.loads(line) for line in (LEARNED_RUN / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _right_answers(record: dict, prompts: dict[str, int]) -> tuple[int, dict[str, int]]:
    """The samples per prompt and each family's right answers of a logged validation (verl's val-core mean)."""
    samples, counts = 0, {}
    for key, value in record["data"].items():
        match = run_report.VAL_CORE.match(key)
        if match:
            samples = int(match["samples"])
            counts[match["source"]] = round(value * samples * prompts[match["source"]])
    return samples, counts


def write_run(folder: Path, records: list[dict], first_on_last_wrong: bool = True) -> Path:
    """A run folder as verl leaves it: ``records`` as its metrics log, and for each logged validation a dump with the
    logged right answers per family (the module's docstring)."""
    question_family = held_out_questions()
    prompts = pd.Series(question_family).value_counts().to_dict()
    (folder / "validation").mkdir(parents=True)
    (folder / "rollouts").mkdir()
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    first = min(r["step"] for r in records if _right_answers(r, prompts)[1])
    for record in records:
        samples, counts = _right_answers(record, prompts)
        rows = []
        for family, right in counts.items():
            questions = [q for q, f in question_family.items() if f == family]
            if first_on_last_wrong and record["step"] == first:
                questions = questions[::-1]  # the later validations fill the first prompts
            for i, question in enumerate(questions):
                for j in range(samples):
                    score = float(i * samples + j < right)
                    rows.append({"input": f"user\n{question}\nassistant\n", "output": "7" if score else "8",
                                 "gts": "7", "score": score, "step": record["step"], "uid": f"u{i}_{j}_0"})
        if rows:
            (folder / "validation" / f"{record['step']}.jsonl").write_text(
                "\n".join(json.dumps(r) for r in rows) + "\n")
    return folder


def read(folder: Path) -> run_report.RunRecord:
    return run_report.read_run("bv_blend", folder, held_out_questions())


def validation_of(record: dict) -> dict:
    return {k: v for k, v in record["data"].items() if k.startswith("val-")}


def without_validation(record: dict) -> dict:
    return {**record, "data": {k: v for k, v in record["data"].items() if not k.startswith("val-")}}


def flat(records: list[dict]) -> list[dict]:
    """The committed run as the demo logs it (validations at its start and end only), its end validated as its
    start: the same right answers per family, on other prompts."""
    out = [records[0], *(without_validation(r) for r in records[1:])]
    out[-1] = {**out[-1], "data": {**out[-1]["data"], **validation_of(records[0])}}
    return out


def fell(records: list[dict]) -> list[dict]:
    """The committed run backwards: its end's pass rates at the start, its start's at the end."""
    out = flat(records)
    out[0] = {**out[0], "data": {**without_validation(out[0])["data"], **validation_of(records[-1])}}
    return out


def about(**changes) -> demo_report.RunAbout:
    values = {"label": "BV-Blend cluster level n=2", "estimator": "bv_blend", "batch": 32, "n": 2, "steps": 20,
              "lr": 2e-5, "dtype": "fp32", "seed": 0, "differences": ("test_freq: 10 -> 20",)}
    return demo_report.RunAbout(**(values | changes))


@pytest.fixture(scope="module")
def comparison() -> demo_report.Comparison:
    return demo_report.read_comparison(pipeline.COMPARISON_SUMMARY, pipeline.DEMO_ARM)


def test_a_committed_run_of_the_arm_learned_and_its_numbers_are_verl_s(tmp_path, comparison):
    records = committed_metrics()
    run = read(write_run(tmp_path / "run", records))
    rows = demo_report.held_out_table(run)
    assert list(rows) == ["echo3", "plus_tiny", "plus_digit", "times_12", "sum_2digit", "all"]  # the task's order
    logged = run_report.validation_curve(run_report.read_metrics(LEARNED_RUN / "metrics.jsonl"))
    for family, row in rows.items():
        assert row.prompts == (120 if family == "all" else 24)
        assert row.before.value == pytest.approx(logged.loc[0, family]) and row.after.value == pytest.approx(
            logged.loc[20, family])
        assert row.gain.value == pytest.approx(row.after.value - row.before.value)
        assert row.verdict == demo_report.LEARNED and row.gain.low > 0
    text = demo_report.demo_report(run, about(), comparison)
    assert "ONE run, seed 0; the comparison's settings but test_freq: 10 -> 20" in text.splitlines()[0]
    verdict = next(line for line in text.splitlines() if line.startswith("this run (one seed): "))
    assert verdict.startswith("this run (one seed): learned: the held-out pass rate rose from 0.094 ")
    assert "whose 95% interval lies above zero" in verdict
    png = demo_report.plot_run(run, comparison, tmp_path / "held_out.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_flat_run_and_a_run_that_fell_did_not_learn(tmp_path, comparison):
    records = committed_metrics()
    for name, made, says in (("flat", flat(records), "whose 95% interval holds zero"),
                             ("fell", fell(records), "the held-out pass rate fell from 0.675 ")):
        run = read(write_run(tmp_path / name, made))
        assert list(run.validation.index) == [0, 20]  # as the demo validates: before the first update, after the last
        rows = demo_report.held_out_table(run)
        assert {row.verdict for row in rows.values()} == {demo_report.DID_NOT_LEARN}
        text = demo_report.demo_report(run, about(), comparison)
        verdict = next(line for line in text.splitlines() if line.startswith("this run (one seed): "))
        assert verdict.startswith("this run (one seed): did not learn: ") and says in verdict
        assert "learned" not in verdict.replace("did not learn", "")
    assert rows["all"].gain.high < 0  # the fall's interval lies below zero: still "did not learn", said as a fall


def test_the_comparison_s_result_is_read_from_its_file_and_labelled_as_its(tmp_path, comparison):
    """Beside the one run: the five-seed finals of the same arm and GRPO n = 8 and their difference, as
    results/regime/pretrained_lm.json holds them (not restated by hand)."""
    committed = json.loads(pipeline.COMPARISON_SUMMARY.read_text())
    arm, reference = committed["arms"]["bv_cluster2"], committed["arms"]["grpo8"]
    assert comparison.seeds == committed["seeds"] and comparison.arm_finals == arm["finals"]
    assert comparison.arm_final == Interval(**arm["final"]) and comparison.reference_final == Interval(
        **reference["final"])
    assert comparison.difference == Interval(**arm["difference"]) and comparison.verdict == arm["verdict"]
    run = read(write_run(tmp_path / "run", committed_metrics()))
    lines = demo_report.demo_report(run, about(), comparison).splitlines()
    start = lines.index(next(line for line in lines if line.startswith("the comparison's result")))
    assert lines[start].startswith(f"the comparison's result (pretrained_lm.json: {len(committed['seeds'])} seeds, ")
    shown = lambda interval, signed=False: demo_report.format_interval(Interval(**interval), signed)  # noqa: E731
    assert lines[start + 1].endswith(shown(arm["final"])) and "BV-Blend cluster level n=2" in lines[start + 1]
    assert lines[start + 2].endswith(shown(reference["final"])) and "GRPO n=8" in lines[start + 2]
    assert lines[start + 3].endswith(f"paired by seed: {shown(arm['difference'], True)}: {arm['verdict']}")
    assert lines[start + 4].startswith(f"  its own seed-0 run of this arm, on this run's prompts, ended at "
                                       f"{arm['finals'][0]:.3f}")
    assert lines[-1].startswith("This demo trains BV-Blend alone")
    # at other settings the comparison's figures are said to be of another setting, and no seed of it is matched
    other = demo_report.demo_report(run, about(lr=1e-4, differences=("lr: 2e-05 -> 0.0001", "test_freq: 10 -> 20")),
                                    comparison)
    assert "settings that differ from the comparison's: lr: 2e-05 -> 0.0001" in other.splitlines()[0]
    assert "the comparison's figures are of another setting" in other and "its own seed-0 run" not in other
    summary = json.loads(json.dumps(demo_report.demo_summary(run, about(), comparison)))
    assert summary["run"]["seeds"] == 1 and summary["run"]["verdict"] == "learned"
    assert summary["comparison"]["difference"] == arm["difference"]


def test_a_run_that_cannot_show_a_gain_is_refused(tmp_path):
    records = committed_metrics()
    for name, made, message in (
        ("no start", records[1:], "no validation before training .*val_before_train=true"),
        ("no end", [records[0], *(without_validation(r) for r in records[1:])], "no validation after training"),
    ):
        with pytest.raises(ValueError, match=message):
            demo_report.held_out_table(read(write_run(tmp_path / name, made)))
    # a dump that is not the logged run's
    folder = write_run(tmp_path / "other dump", records)
    dump = folder / "validation" / "20.jsonl"
    rows = [json.loads(line) for line in dump.read_text().splitlines()]
    rows[0]["score"] = 1.0 - rows[0]["score"]
    dump.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ValueError, match=r"step 20: verl logged 0.9375 for echo3, its dump holds 0.9271: the dump is"):
        demo_report.held_out_table(read(folder))
    # an end validated on other prompts than the start: the gain is paired by prompt
    folder = write_run(tmp_path / "fewer", records)
    dump = folder / "validation" / "20.jsonl"
    lines = dump.read_text().splitlines()
    question = json.loads(lines[-1])["input"]
    dump.write_text("\n".join(line for line in lines if json.loads(line)["input"] != question) + "\n")
    with pytest.raises(ValueError, match="validated 120 held-out prompts at step 0 and 119 at step 20"):
        demo_report.held_out_table(read(folder))
    with pytest.raises(ValueError, match="no interval .*one held-out prompt"):
        demo_report.learning_verdict(Interval(0.5, np.nan, np.nan))


def test_a_comparison_file_that_cannot_be_read_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file.*scripts/compare_cpu.py --regime-summary"):
        demo_report.read_comparison(tmp_path / "absent.json", pipeline.DEMO_ARM)
    committed = json.loads(pipeline.COMPARISON_SUMMARY.read_text())
    del committed["arms"]["bv_cluster2"]
    (tmp_path / "pretrained_lm.json").write_text(json.dumps(committed))
    with pytest.raises(ValueError, match=r"holds no reading of \['bv_cluster2'\]"):
        demo_report.read_comparison(tmp_path / "pretrained_lm.json", pipeline.DEMO_ARM)
