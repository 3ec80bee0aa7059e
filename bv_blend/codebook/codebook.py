"""The K-means codebook that maps a prompt embedding to its semantic cluster (spec section 6).

A codebook is fixed before training: K L2-normalised centroids plus the metadata needed to
reproduce it and to refuse embeddings from another encoder. It is stored as one ``.npz`` file
(numpy, ``allow_pickle=False``) holding two arrays:

- ``centroids``: float32 [K, D], each row L2-normalised;
- ``metadata``: a 0-d unicode array with the JSON metadata (see :class:`Codebook`).

``content_hash`` is the SHA-256 of the centroid bytes and the metadata (without the hash itself),
so a truncated, edited or foreign file fails to load with a clear error instead of silently
producing other cluster ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# The extra_info key that holds a row's integer cluster id; the verl glue reads it.
CLUSTER_KEY = "bv_blend_cluster"
# What fit_codebook fits with (the command line's --algorithm choices).
ALGORITHMS = ("kmeans", "minibatch")

FORMAT_VERSION = 1
_FORMAT_NAME = "bv_blend.codebook"


@dataclass
class Codebook:
    """K L2-normalised centroids with the metadata that pins down how they were built.

    ``text_field``, ``strip_prefix`` and ``strip_suffix`` record how the problem text was taken
    from each row, so that prompts assigned on the fly are cut exactly like the training prompts.
    """

    centroids: np.ndarray
    encoder_id: str
    seed: int
    train_count: int
    cluster_sizes: list[int]
    normalized: bool = True
    algorithm: str = "kmeans"
    text_field: str | None = None
    strip_prefix: str = ""
    strip_suffix: str = ""
    content_hash: str = field(default="")

    def __post_init__(self) -> None:
        centroids = np.asarray(self.centroids)
        if centroids.ndim != 2 or centroids.shape[0] < 1 or centroids.shape[1] < 1:
            raise ValueError(f"codebook centroids must be a non-empty [K, D] matrix, got shape {centroids.shape}")
        if not np.all(np.isfinite(centroids)):
            raise ValueError("codebook centroids contain NaN or infinite values")
        self.centroids = np.ascontiguousarray(centroids, dtype=np.float32)
        if len(self.cluster_sizes) != self.num_clusters:
            raise ValueError(f"cluster_sizes has {len(self.cluster_sizes)} entries for {self.num_clusters} clusters")
        self.cluster_sizes = [int(s) for s in self.cluster_sizes]
        if not self.content_hash:
            self.content_hash = self._compute_hash()

    @property
    def num_clusters(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def dim(self) -> int:
        return int(self.centroids.shape[1])

    # ----------------------------------------------------------------------------- metadata / hash
    def metadata(self) -> dict[str, Any]:
        """All fields except the centroids, as JSON-serialisable values."""
        meta = {k: v for k, v in asdict(self).items() if k != "centroids"}
        meta.update(format=_FORMAT_NAME, format_version=FORMAT_VERSION, dim=self.dim, num_clusters=self.num_clusters)
        return meta

    def _compute_hash(self) -> str:
        meta = self.metadata()
        meta.pop("content_hash")
        digest = hashlib.sha256(self.centroids.tobytes())
        digest.update(json.dumps(meta, sort_keys=True).encode())
        return digest.hexdigest()

    # ----------------------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike) -> Path:
        """Write the codebook atomically (temp file + rename) and return its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, centroids=self.centroids, metadata=np.array(json.dumps(self.metadata(), sort_keys=True)))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Codebook:
        """Read a codebook written by :meth:`save`; a corrupt or foreign file raises ``ValueError``. A leading ``~`` is
        the user's home (a hydra override such as ``codebook_path=~/k64/codebook.npz`` reaches us unexpanded)."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"codebook file {path} does not exist; build one with `bv-blend codebook`")
        hint = f"{path} is not a valid bv_blend codebook (rebuild it with `bv-blend codebook`)"
        try:
            with np.load(path, allow_pickle=False) as npz:
                centroids = npz["centroids"]
                meta = json.loads(str(npz["metadata"]))
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
            raise ValueError(f"{hint}: {exc}") from exc
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT_NAME:
            raise ValueError(f"{hint}: missing format marker {_FORMAT_NAME!r}")
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{hint}: format version {meta.get('format_version')} is not {FORMAT_VERSION}")
        stored_hash = meta.get("content_hash", "")
        fields = {k: meta[k] for k in cls.__dataclass_fields__ if k in meta and k not in ("centroids", "content_hash")}
        try:
            book = cls(centroids=centroids, **fields)
        except TypeError as exc:
            raise ValueError(f"{hint}: {exc}") from exc
        if book.content_hash != stored_hash:
            raise ValueError(f"{hint}: content hash mismatch (file is corrupt or was edited)")
        if (meta.get("dim"), meta.get("num_clusters")) != (book.dim, book.num_clusters):
            raise ValueError(f"{hint}: dim/num_clusters in metadata disagree with the centroids")
        return book

    # ----------------------------------------------------------------------------- assignment
    def assign(self, embeddings: np.ndarray) -> np.ndarray:
        """Nearest centroid for each row of ``embeddings`` [N, D]; returns int64 ids in 0..K-1.

        Centroids are unit vectors, so for L2-normalised embeddings argmin ||e - c|| equals
        argmax e . c; we normalise the embeddings here too, so the rule is the spec's on any input.
        """
        emb = np.asarray(embeddings, dtype=np.float32)
        if emb.ndim == 1:
            emb = emb[None, :]
        if emb.ndim != 2 or emb.shape[1] != self.dim:
            raise ValueError(
                f"embedding dimension {emb.shape[-1] if emb.ndim else '?'} does not match the codebook's dimension "
                f"{self.dim} (encoder {self.encoder_id!r}); encode with the codebook's encoder"
            )
        if emb.shape[0] == 0:
            return np.zeros(0, dtype=np.int64)
        if not np.all(np.isfinite(emb)):
            raise ValueError("embeddings contain NaN or infinite values")
        emb = l2_normalize(emb)
        return np.argmax(emb @ self.centroids.T, axis=1).astype(np.int64)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (a zero row stays zero)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32)


def fit_codebook(
    embeddings: np.ndarray,
    num_clusters: int,
    *,
    encoder_id: str,
    seed: int = 0,
    algorithm: str = "kmeans",
    **text_meta: Any,
) -> Codebook:
    """Fit K-means on L2-normalised embeddings and return a :class:`Codebook`.

    ``algorithm="kmeans"`` is scikit-learn's Lloyd K-means with one seeded k-means++ start (the
    default: it reproduces bit for bit with the same seed and thread count, and is fast enough for
    45k x 384, see docs/codebook.md); ``"minibatch"`` is MiniBatchKMeans for much larger corpora.
    The centroids are re-normalised to unit length, and ``cluster_sizes`` counts the training
    embeddings under :meth:`Codebook.assign`, the rule used everywhere else.
    """
    try:
        from sklearn.cluster import KMeans, MiniBatchKMeans
    except ImportError as exc:
        raise ImportError(f"K-means needs scikit-learn ({exc}): pip install 'bv-blend[codebook]'.") from exc

    emb = l2_normalize(np.asarray(embeddings, dtype=np.float32))
    n = emb.shape[0]
    if num_clusters < 1:
        raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
    if num_clusters > n:
        raise ValueError(
            f"num_clusters={num_clusters} is larger than the number of prompts ({n}); use K <= {n} or add prompts"
        )
    if algorithm == "kmeans":
        km = KMeans(n_clusters=num_clusters, n_init=1, random_state=seed, algorithm="lloyd")
    elif algorithm == "minibatch":
        km = MiniBatchKMeans(n_clusters=num_clusters, n_init=1, random_state=seed, batch_size=4096)
    else:
        raise ValueError(f"algorithm must be 'kmeans' or 'minibatch', got {algorithm!r}")
    km.fit(emb)
    centroids = l2_normalize(km.cluster_centers_.astype(np.float32))
    book = Codebook(
        centroids=centroids,
        encoder_id=encoder_id,
        seed=seed,
        train_count=n,
        cluster_sizes=[0] * num_clusters,
        algorithm=algorithm,
        **text_meta,
    )
    book.cluster_sizes = np.bincount(book.assign(emb), minlength=num_clusters).tolist()
    book.content_hash = book._compute_hash()
    return book
