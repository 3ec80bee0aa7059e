"""What every verl run of a work folder shares, made once: the task and its held-out split, the model (SmolLM2
converted once and cached, or a user's folder, checked), the codebook of the training prompts and the annotated
training file (instruments/run/settings.py, :class:`Prepared`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from instruments.run import pretrained
from instruments.run.settings import (
    PREPARED_FILE,
    PRETRAINED_INSTRUCTION,
    SMOLLM2,
    Prepared,
    RunSettings,
    key_differences,
)
from instruments.run.task import assert_disjoint, read_questions, write_task


def prepare_pretrained(s: RunSettings) -> Path:
    """The pretrained model's folder: SmolLM2 converted once and cached, or the user's folder, checked."""
    if s.model == SMOLLM2:
        print(f"[demo] {pretrained.SMOLLM2}: converting the packaged GGUF file once (about two minutes), then cached")
        return pretrained.prepare_smollm2()
    path = Path(s.model).expanduser().resolve()
    pretrained.check_model_folder(path)
    return path


def build_clusters(s: RunSettings, train: Path) -> tuple[Path, Path]:
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


def prepare(s: RunSettings, reuse: bool = False) -> Prepared:
    """Task, model and codebook in ``s.work_dir``; with ``reuse``, a finished preparation made with the
    same settings (``prepared.json``) is taken as it is."""
    marker = s.work_dir / PREPARED_FILE
    if reuse and marker.is_file():
        saved = json.loads(marker.read_text())
        if saved["key"] == s.preparation_key():
            print(f"[demo] reusing the task, model and codebook prepared in {s.work_dir}")
            saved = _with_files_here(saved, marker)
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


PREPARED_FILES = ("train", "val", "codebook")  # the record's files, under the work folder it was made in


def _with_files_here(saved: dict, marker: Path) -> dict:
    """A preparation restored into another folder than the one it was made in (scripts/run_state.py restore into
    another ``--out``: scripts/fair_verdict.py's folders, where scripts/tune_lr.py made the first) names its files
    where they were made, which may be gone (another machine) or another folder's. A preparation writes its files
    under its own work folder, so the folder it was made in is their common parent: where that is not this one and
    the same files lie at the same places here, the record points at them; otherwise it is left as it was."""
    recorded = {name: Path(saved[name]) for name in PREPARED_FILES}
    made_in = Path(os.path.commonpath([str(path) for path in recorded.values()]))
    here = {name: marker.parent / path.relative_to(made_in) for name, path in recorded.items()}
    if made_in.resolve() == marker.parent.resolve() or not all(path.is_file() for path in here.values()):
        return saved
    print(f"[demo] the preparation was made in {made_in}: its files are read from {marker.parent}")
    saved = {**saved, **{name: str(path) for name, path in here.items()}}
    marker.write_text(json.dumps(saved, indent=2))
    return saved


def _with_model_present(s: RunSettings, saved: dict, marker: Path) -> dict:
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
