"""The paper end to end: prepare the OpenR1 training set, build the prompt-cluster codebook, train.

Each step is one of the project's commands run as a subprocess (the data and training scripts of a checkout, and
the installed ``bv-blend codebook``), so the pipeline does exactly what a user typing the three commands would
do. A step whose outputs already exist is skipped (resume after a crash).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bv_blend.paper.configs import compose_paper_config, paper_config_names
from bv_blend.verl.context_budget import check_context_budget
from bv_blend.verl.overrides import override_value

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"  # a source checkout's scripts/
DEFAULT_NUM_CLUSTERS = 64  # [choice] the paper does not state K: 45k prompts / 64 = ~700 per cluster


@dataclass(frozen=True)
class Step:
    name: str
    argv: list[str]
    outputs: tuple[Path, ...]

    def done(self) -> bool:
        return all(path.exists() for path in self.outputs)

    def shell(self) -> str:
        return shlex.join(self.argv)


def paper_steps(
    *,
    openr1: Sequence[Path],
    model: Path,
    val_files: Sequence[Path],
    work_dir: Path,
    config: str = "qwen25_math_7b",
    num_clusters: int = DEFAULT_NUM_CLUSTERS,
    gpus_per_node: int = 8,
    nnodes: int = 1,
    ray_address: str | None = None,
    overrides: Sequence[str] = (),
    python: str = sys.executable,
    scripts_dir: Path = SCRIPTS,
) -> list[Step]:
    """The three steps' commands, after checking the inputs that must exist before anything runs.

    Raises:
        FileNotFoundError: an OpenR1 shard, the model folder or a validation file is missing.
        ValueError: no OpenR1 shard, K < 2, an unknown config, or lengths the model's context cannot hold (the
            16k main config with the stock 4k model, say: hours of data preparation would end in that error).
    """
    if not openr1:
        raise ValueError("--openr1 needs the OpenR1-Math-220k parquet shards (data/train-*.parquet).")
    for flag, paths in (("--openr1", openr1), ("--val-files", val_files), ("--model", [model])):
        for path in paths:
            if not Path(path).expanduser().exists():
                raise FileNotFoundError(f"{flag}: {path} does not exist; fix the path.")
    if num_clusters < 2:
        raise ValueError(f"--num-clusters must be >= 2, got {num_clusters}.")
    if config not in paper_config_names():
        names = ", ".join(paper_config_names())
        raise ValueError(f"--config {config!r} is not in configs/paper/; choose one of {names}.")
    model_override = f"actor_rollout_ref.model.path={override_value(str(Path(model).expanduser().resolve()))}"
    check_context_budget(compose_paper_config(config, [model_override, *overrides]), model)
    work = Path(work_dir).expanduser().resolve()
    train = work / "data" / "train.parquet"
    codebook_dir = work / f"codebook_k{num_clusters}"
    codebook, annotated = codebook_dir / "codebook.npz", codebook_dir / train.name
    run_dir = work / "runs" / config
    abs_paths = [str(Path(p).expanduser().resolve()) for p in openr1]
    model_path = str(Path(model).expanduser().resolve())
    train_cmd = [
        python, str(scripts_dir / "train.py"), "--config", config,
        "--train-files", str(annotated),
        "--val-files", *(str(Path(p).expanduser().resolve()) for p in val_files),
        "--model", model_path, "--codebook", str(codebook),
        "--gpus-per-node", str(gpus_per_node), "--nnodes", str(nnodes), "--output-dir", str(run_dir),
    ]
    if ray_address:
        train_cmd += ["--ray-address", ray_address]
    if overrides:
        train_cmd += ["--", *overrides]
    return [
        Step(
            "prepare",
            [python, str(scripts_dir / "prepare_openr1_math.py"), *abs_paths, "--tokenizer", model_path,
             "--output", str(train)],
            (train,),
        ),
        Step(
            "codebook",
            # the installed command (bv_blend.cli), run with the same Python: `bv-blend codebook ...`
            [python, "-m", "bv_blend.cli", "codebook", str(train), "--num-clusters", str(num_clusters),
             "--out-dir", str(codebook_dir)],
            (codebook, annotated),
        ),
        # training has no "done" marker: verl itself resumes from the last checkpoint (trainer.resume_mode=auto)
        Step("train", train_cmd, ()),
    ]


def run_steps(steps: Sequence[Step], dry_run: bool = False, force: bool = False) -> int:
    """Run the steps in order, stopping at the first failure; returns the exit code."""
    for step in steps:
        if step.outputs and step.done() and not force:
            print(f"[{step.name}] outputs exist, skipped: {', '.join(map(str, step.outputs))}", flush=True)
            continue
        print(f"[{step.name}] {step.shell()}", flush=True)
        if dry_run:
            continue
        code = subprocess.run(step.argv, check=False).returncode
        if code != 0:
            print(f"[{step.name}] failed with exit code {code}; later steps not run.", file=sys.stderr)
            return code
    return 0
