"""A preparation restored into another folder than the one it was made in (instruments/run/prepare.py): its record
names the files where they were made; reusing it reads them from its own folder, as scripts/fair_verdict.py needs
where it restores the tuning state scripts/tune_lr.py made under another --out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from instruments.run import prepare as run_prepare
from instruments.run.settings import RunSettings


def made_in(folder: Path, model: Path) -> tuple[RunSettings, Path]:
    """A finished preparation's files and record in ``folder`` (as prepare writes them), for a user's model."""
    settings = RunSettings(work_dir=folder, model=str(model))
    (folder / "task").mkdir(parents=True)
    (folder / "clusters").mkdir()
    val = folder / "task" / "val.parquet"
    pd.DataFrame({"extra_info": [{"question": "What is 2 + 3?", "family": "plus_tiny"}]}).to_parquet(val)
    for name in ("task/train.parquet", "clusters/train.parquet", "clusters/codebook.npz"):
        (folder / name).write_bytes(b"made here")
    marker = folder / "prepared.json"
    marker.write_text(json.dumps({"key": settings.preparation_key(), "model": str(model),
                                  "train": str(folder / "clusters" / "train.parquet"), "val": str(val),
                                  "codebook": str(folder / "clusters" / "codebook.npz"), "warmup_pass_rates": {}}))
    return settings, marker


def test_a_preparation_moved_to_another_folder_reads_its_own_files(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    made_in(tmp_path / "tune_lr" / "prepared", model)
    moved = tmp_path / "fair_verdict" / "prepared"
    shutil.copytree(tmp_path / "tune_lr" / "prepared", moved)
    shutil.rmtree(tmp_path / "tune_lr")  # another machine: where it was made is gone
    prepared = run_prepare.prepare(RunSettings(work_dir=moved, model=str(model)), reuse=True)
    assert (prepared.train, prepared.val, prepared.codebook) == (moved / "clusters" / "train.parquet",
                                                                 moved / "task" / "val.parquet",
                                                                 moved / "clusters" / "codebook.npz")
    assert prepared.question_family == {"What is 2 + 3?": "plus_tiny"}
    record = json.loads((moved / "prepared.json").read_text())
    assert record["val"] == str(moved / "task" / "val.parquet") and record["model"] == str(model)


def test_a_preparation_in_its_own_folder_or_without_its_files_here_is_left_as_it_was(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    settings, marker = made_in(tmp_path / "here" / "prepared", model)
    before = marker.read_text()
    run_prepare.prepare(settings, reuse=True)
    assert marker.read_text() == before
    # a record whose files are not here either is not pointed anywhere new (reading it fails as before)
    elsewhere = json.loads(before)
    elsewhere = {**elsewhere, **{k: elsewhere[k].replace(str(tmp_path / "here"), "/gone") for k in
                                 run_prepare.PREPARED_FILES}}
    saved = run_prepare._with_files_here({**elsewhere, "train": "/gone/prepared/clusters/other.parquet"}, marker)
    assert saved["train"] == "/gone/prepared/clusters/other.parquet" and saved["val"].startswith("/gone/")
