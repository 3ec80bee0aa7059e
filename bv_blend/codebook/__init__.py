"""The offline codebook pipeline (spec section 6): prompt text -> sentence embedding -> K-means cluster id.

- ``codebook.py``: the codebook file (save, load, validate) and nearest-centroid assignment; numpy only.
- ``encode.py``: problem-text extraction, sentence-transformers encoding with an on-disk cache, on-the-fly
  assignment (:class:`ClusterAssigner`).
- ``annotate.py``: verl parquet files -> codebook + annotated copies + a report (``bv-blend codebook``).
- ``parquet.py``: the checked parquet reader shared with the paper kit's data loader.

The verl glue imports this package on every trainer start (for ``CLUSTER_KEY``), so only ``codebook.py`` is
imported eagerly; the names of ``encode`` and ``annotate`` (sentence-transformers, pyarrow) load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from bv_blend.codebook.codebook import CLUSTER_KEY, Codebook, fit_codebook, l2_normalize

_LAZY = {
    "DEFAULT_ENCODER": "encode",
    "ClusterAssigner": "encode",
    "EmbeddingCache": "encode",
    "TextEncoder": "encode",
    "extract_problem_text": "encode",
    "extract_problem_texts": "encode",
    "BuildResult": "annotate",
    "add_cluster_ids": "annotate",
    "build_codebook_from_parquet": "annotate",
    "read_cluster_ids": "annotate",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CLUSTER_KEY", "Codebook", "fit_codebook", "l2_normalize", *_LAZY]
