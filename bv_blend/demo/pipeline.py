"""The demo, end to end: tiny model + task -> warm-up -> codebook -> GRPO and BV-Blend with verl on CPU -> table.

Every stage writes into one work folder; verl runs as a subprocess per method (bv_blend.verl.cpu.launch), on the
same data, seed and warmed-up model, so the two runs differ only in ``algorithm.adv_estimator``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bv_blend.demo import model as tiny
from bv_blend.demo import report
from bv_blend.demo.task import make_problems, write_task
from bv_blend.demo.warmup import expected_group_shares, pass_rates, supervised_warmup

METHODS = ("grpo", "bv_blend")


@dataclass
class DemoSettings:
    """What the command-line flags change; larger values make the demo longer (docs/cpu.md)."""

    work_dir: Path
    steps: int = 30  # RL steps per method
    batch: int = 16  # prompts per step
    n: int = 4  # rollouts per prompt (group size)
    warmup_steps: int = 800  # with lr 1e-3 cosine: easy families ~0.9, products ~0.5, two-digit sums ~0.03
    num_clusters: int = 8
    n_train: int = 2048
    layers: int = 2
    hidden: int = 128
    seed: int = 0
    timeout_s: float = 1500.0  # per verl run


def prepare_model(s: DemoSettings) -> tuple[Path, dict[str, float]]:
    """Builds the tokenizer and model, warms it up and saves it; returns its folder and sampled pass rates."""
    out = s.work_dir / "model"
    # one thread: for a model this small, OpenMP synchronisation costs more than the second core gives
    torch.set_num_threads(1)
    tokenizer = tiny.build_tokenizer(tiny.TinyModelSpec.vocab, seed=s.seed)
    model = tiny.build_model(tiny.TinyModelSpec(layers=s.layers, hidden=s.hidden, seed=s.seed), tokenizer)
    supervised_warmup(model, tokenizer, s.warmup_steps, batch_size=32, lr=1e-3, seed=s.seed)
    # 64 prompts per family x n samples: enough to tell 0.9 from 0.5 from 0.05
    rates = pass_rates(model, tokenizer, make_problems(320, seed=s.seed + 7), samples=s.n, seed=s.seed)
    tiny.save(model, tokenizer, out)
    return out, rates


def build_clusters(s: DemoSettings, train: Path, val: Path) -> tuple[Path, list[Path]]:
    """Codebook of the task's prompts with the packaged MiniLM encoder + annotated parquet copies."""
    from bv_blend.codebook.annotate import build_codebook_from_parquet

    result = build_codebook_from_parquet([train, val], s.work_dir / "clusters", s.num_clusters, seed=s.seed)
    return result.codebook_path, result.annotated_paths


def verl_overrides(s: DemoSettings, method: str, model: Path, data: list[Path], codebook: Path,
                   run_dir: Path) -> list[str]:
    """The per-run hydra overrides on top of configs/cpu_tiny.yaml; identical between methods but the estimator."""
    return [
        f"algorithm.adv_estimator={method}",
        f"algorithm.bv_blend.codebook_path={codebook}",
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data[0]}",
        f"data.val_files={data[1]}",
        f"data.train_batch_size={s.batch}",
        f"data.seed={s.seed}",
        f"++actor_rollout_ref.actor.ppo_mini_batch_size={s.batch}",
        f"++actor_rollout_ref.rollout.n={s.n}",
        f"trainer.total_training_steps={s.steps}",
        f"trainer.experiment_name={method}",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        f"++trainer.rollout_data_dir={run_dir / 'rollouts'}",
    ]


def run_method(s: DemoSettings, method: str, model: Path, data: list[Path], codebook: Path) -> Path:
    from bv_blend.verl.cpu.launch import run_trainer

    run_dir = s.work_dir / "runs" / method
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rc = run_trainer(verl_overrides(s, method, model, data, codebook, run_dir), log_path=run_dir / "verl.log",
                     metrics_path=run_dir / "metrics.jsonl", timeout_s=s.timeout_s)
    print(f"[demo] {method}: verl exited {rc} after {time.time() - started:.0f} s (log: {run_dir / 'verl.log'})")
    if rc != 0:
        log = run_dir / "verl.log"
        raise RuntimeError(f"verl's trainer failed for {method} (exit {rc}); the end of {log} says why")
    return run_dir


def run_demo(s: DemoSettings) -> str:
    """All stages; returns the comparison table (also written to work_dir/table.txt next to curves.png)."""
    t0 = time.time()
    s.work_dir.mkdir(parents=True, exist_ok=True)
    train, val = write_task(s.work_dir / "task", s.n_train, 64, s.seed)
    print("[demo] warming up the tiny model (supervised, a few minutes at most)")
    model, rates = prepare_model(s)
    print("[demo] pass rates after warm-up (sampled, T=1): " + ", ".join(f"{k} {v:.2f}" for k, v in rates.items()))
    shares = expected_group_shares(rates, s.n)
    print(f"[demo] expected groups of {s.n} rollouts (p^n all-right, (1-p)^n all-wrong): "
          + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    print("[demo] building the codebook with the packaged MiniLM encoder")
    codebook, annotated = build_clusters(s, train, val)
    curves, summaries = {}, {}
    for method in METHODS:
        print(f"[demo] training with {method} on verl's stock trainer (CPU)")
        run_dir = run_method(s, method, model, annotated, codebook)
        metrics = report.read_metrics(run_dir / "metrics.jsonl")
        signal = report.signal_of(method, metrics, run_dir / "rollouts")
        curves[method] = (metrics, signal)
        summaries[method] = report.run_summary(metrics, signal) | report.group_shares(run_dir / "rollouts")
    table = report.comparison_table(summaries)
    png = report.plot_curves(curves, s.work_dir / "curves.png")
    (s.work_dir / "table.txt").write_text(table + "\n")
    settings = {k: str(v) for k, v in asdict(s).items()}
    (s.work_dir / "summary.json").write_text(json.dumps(
        {"settings": settings, "warmup_pass_rates": rates, "expected_group_shares": shares, "table": summaries,
         "wall_s": time.time() - t0}, indent=2))
    print(f"[demo] plot: {png}\n[demo] total {time.time() - t0:.0f} s")
    return table
