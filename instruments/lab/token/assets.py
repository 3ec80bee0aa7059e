"""What a no-revisit suite prepares once, before its runs, and every run reads: the codebook's clusters of the pool
and the offline priors (results/regime.md, addendum).

- **Clusters**: what a user would have, the package's codebook (``bv_blend.codebook``: all-MiniLM-L6-v2 + K-means)
  fitted on the training pool's prompt text, as ``bv-blend codebook`` fits it on a training parquet. Saved as
  ``{question: cluster}`` with the NMI against the task's families.
- **Priors**: ``prior_samples`` scores per pool prompt from the warmed-up (initial) policy at T = 1, drawn with a
  seed of their own, in the package's prior file format (``bv_blend.history.priors.write_priors``).

Both live in the suite's warm-up folder and are made in the suite's main process (runner.prepare_warmup), so the
worker processes only read them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm import tqdm

from instruments.demo.task import Problem, families_of

if TYPE_CHECKING:
    from instruments.lab.token.run import LabSettings

PRIORS_SEED = 7_000_001
CHUNK = 100  # prompts per generate call (as held-out evaluations chunk them)


def clusters_path(settings: LabSettings, cache: Path) -> Path:
    return Path(cache) / f"clusters_{settings.task}_pool{settings.pool_size}_k{settings.num_clusters}.json"


def priors_path(settings: LabSettings, cache: Path) -> Path:
    return Path(cache) / f"priors_{settings.task}_pool{settings.pool_size}_n{settings.prior_samples}.json"


def load_clusters(settings: LabSettings, cache: Path, pool: list[Problem]) -> np.ndarray:
    """Each pool prompt's cluster: its family (``clusters="family"``) or the codebook's (``"codebook"``)."""
    if settings.clusters == "family":
        index = {family: k for k, family in enumerate(families_of(settings.task))}
        return np.array([index[p.family] for p in pool])
    path = clusters_path(settings, cache)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the suite's main process builds it (runner.prepare_warmup) "
                                "before any run; run the suite through scripts/lab_token.py")
    by_question = json.loads(path.read_text())["clusters"]
    return np.array([by_question[p.question] for p in pool])


def build_clusters(settings: LabSettings, cache: Path, pool: list[Problem]) -> dict:
    """Fit the package's codebook on the pool's prompt text (once); returns what was saved."""
    path = clusters_path(settings, cache)
    if path.is_file():
        return json.loads(path.read_text())
    from sklearn.metrics import normalized_mutual_info_score

    from bv_blend.codebook.codebook import fit_codebook
    from bv_blend.codebook.encode import TextEncoder

    texts = [p.question for p in pool]
    encoder = TextEncoder()
    embeddings = encoder.encode(texts)
    codebook = fit_codebook(embeddings, settings.num_clusters, encoder_id=encoder.encoder_id, seed=0)
    ids = codebook.assign(embeddings)
    families = [p.family for p in pool]
    saved = {"clusters": {text: int(k) for text, k in zip(texts, ids, strict=True)},
             "num_clusters": settings.num_clusters, "encoder": "all-MiniLM-L6-v2 (bv_blend.codebook default)",
             "nmi_vs_families": float(normalized_mutual_info_score(families, ids)),
             "sizes": np.bincount(ids, minlength=settings.num_clusters).tolist()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(saved))
    return saved


def build_priors(settings: LabSettings, cache: Path, pool: list[Problem], model, tokenizer) -> Path:
    """``prior_samples`` scores per pool prompt from the initial policy (once); returns the prior file."""
    from bv_blend.history.priors import write_priors
    from instruments.demo.standin import sample

    path = priors_path(settings, cache)
    if path.is_file():
        return path
    scores: dict[str, list[float]] = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(PRIORS_SEED)
        for start in tqdm(range(0, len(pool), CHUNK), desc="offline priors", unit="chunk"):
            chunk = pool[start:start + CHUNK]
            values = sample(model, tokenizer, chunk, settings.prior_samples, settings.max_new_tokens).scores
            for i, problem in enumerate(chunk):
                scores[problem.question] = values[i * settings.prior_samples:(i + 1) * settings.prior_samples].tolist()
    write_priors(path, scores)
    return path
