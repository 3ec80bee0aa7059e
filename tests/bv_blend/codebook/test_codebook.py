"""Codebook: real scikit-learn K-means, the .npz file format, assignment, and clear errors on bad input."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from bv_blend.codebook import CLUSTER_KEY, Codebook, fit_codebook, l2_normalize


def blobs(n_per: int = 40, centers: int = 4, dim: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Well-separated unit-vector clusters around random directions, with their true labels."""
    rng = np.random.default_rng(seed)
    directions = l2_normalize(rng.normal(size=(centers, dim)))
    labels = np.repeat(np.arange(centers), n_per)
    points = directions[labels] + 0.05 * rng.normal(size=(len(labels), dim))
    return l2_normalize(points), labels


def test_cluster_key_is_the_documented_extra_info_key():
    assert CLUSTER_KEY == "bv_blend_cluster"


def test_fit_recovers_separated_clusters_and_records_metadata():
    points, labels = blobs()
    book = fit_codebook(points, 4, encoder_id="enc", seed=3)
    ids = book.assign(points)
    # Each true cluster maps to exactly one codebook cluster, and the mapping is a bijection.
    mapping = {int(t): set(ids[labels == t].tolist()) for t in range(4)}
    assert all(len(v) == 1 for v in mapping.values())
    assert len(set().union(*mapping.values())) == 4
    assert np.allclose(np.linalg.norm(book.centroids, axis=1), 1.0, atol=1e-6)
    assert book.centroids.dtype == np.float32
    assert (book.num_clusters, book.dim, book.train_count, book.seed) == (4, 16, 160, 3)
    assert book.cluster_sizes == np.bincount(ids, minlength=4).tolist() == [40, 40, 40, 40]
    assert book.encoder_id == "enc" and book.normalized is True and len(book.content_hash) == 64


def test_same_inputs_and_seed_give_identical_codebook_and_ids():
    points, _ = blobs(n_per=60, centers=6, seed=1)
    noise = np.random.default_rng(9).normal(size=points.shape) * 0.3
    data = l2_normalize(points + noise)  # overlapping clusters, so k-means++ seeding matters
    a = fit_codebook(data, 6, encoder_id="enc", seed=7)
    b = fit_codebook(data, 6, encoder_id="enc", seed=7)
    assert np.array_equal(a.centroids, b.centroids)
    assert a.content_hash == b.content_hash
    assert np.array_equal(a.assign(data), b.assign(data))
    c = fit_codebook(data, 6, encoder_id="enc", seed=8)
    assert c.content_hash != a.content_hash


def test_minibatch_algorithm_is_also_seeded():
    points, _ = blobs()
    a = fit_codebook(points, 4, encoder_id="enc", seed=0, algorithm="minibatch")
    b = fit_codebook(points, 4, encoder_id="enc", seed=0, algorithm="minibatch")
    assert a.algorithm == "minibatch" and np.array_equal(a.centroids, b.centroids)


def test_assign_is_nearest_centroid_by_euclidean_distance_on_unit_vectors():
    points, _ = blobs(seed=2)
    book = fit_codebook(points, 4, encoder_id="enc", seed=0)
    queries = l2_normalize(np.random.default_rng(5).normal(size=(50, 16)))
    distances = np.linalg.norm(queries[:, None, :] - book.centroids[None, :, :], axis=2)
    expected = distances.argmin(axis=1)
    got = book.assign(queries)
    assert got.dtype == np.int64 and np.array_equal(got, expected)
    # Unnormalised inputs are normalised first: scaling a query does not change its cluster.
    assert np.array_equal(book.assign(queries * 7.5), expected)


def test_save_load_round_trip(tmp_path):
    points, _ = blobs()
    book = fit_codebook(points, 4, encoder_id="enc", seed=0, text_field="extra_info.question", strip_suffix=" Go.")
    path = book.save(tmp_path / "sub" / "codebook.npz")
    loaded = Codebook.load(path)
    assert np.array_equal(loaded.centroids, book.centroids)
    assert loaded.metadata() == book.metadata()
    assert loaded.text_field == "extra_info.question" and loaded.strip_suffix == " Go."
    assert not (tmp_path / "sub" / "codebook.npz.tmp").exists()
    with np.load(path, allow_pickle=False) as npz:  # the documented layout
        meta = json.loads(str(npz["metadata"]))
    for key in ("encoder_id", "dim", "normalized", "num_clusters", "seed", "train_count", "cluster_sizes"):
        assert key in meta


def test_k_larger_than_number_of_prompts_is_a_clear_error():
    points, _ = blobs(n_per=2, centers=2)
    with pytest.raises(ValueError, match=r"num_clusters=5 is larger than the number of prompts \(4\)"):
        fit_codebook(points, 5, encoder_id="enc")


def test_dimension_mismatch_is_a_clear_error():
    points, _ = blobs()
    book = fit_codebook(points, 4, encoder_id="enc")
    with pytest.raises(ValueError, match="embedding dimension 8 does not match the codebook's dimension 16"):
        book.assign(np.ones((3, 8), dtype=np.float32))


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "edit_metadata", "not_npz", "no_metadata"])
def test_corrupt_codebook_fails_to_load_with_value_error(tmp_path, damage):
    points, _ = blobs()
    path = fit_codebook(points, 4, encoder_id="enc").save(tmp_path / "cb.npz")
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip_byte":
        with np.load(path) as npz:
            centroids, meta = npz["centroids"].copy(), npz["metadata"]
        centroids[0, 0] += 0.25
        np.savez(path, centroids=centroids, metadata=meta)
    elif damage == "edit_metadata":
        with np.load(path) as npz:
            centroids, meta = npz["centroids"], json.loads(str(npz["metadata"]))
        meta["encoder_id"] = "another-encoder"
        np.savez(path, centroids=centroids, metadata=np.array(json.dumps(meta)))
    elif damage == "not_npz":
        path.write_text("this is not a codebook")
    else:
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("centroids.npy", b"")
    with pytest.raises(ValueError, match="not a valid bv_blend codebook"):
        Codebook.load(path)


def test_a_path_with_a_tilde_is_the_users_home(tmp_path, monkeypatch):
    """hydra passes ``codebook_path=~/k64/codebook.npz`` through unexpanded (bash expands no ~ after ``a.b=``)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    points, _ = blobs()
    book = fit_codebook(points, 4, encoder_id="enc", seed=0)
    book.save(tmp_path / "k64" / "codebook.npz")
    assert np.array_equal(Codebook.load("~/k64/codebook.npz").centroids, book.centroids)


def test_missing_codebook_file_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="bv-blend codebook"):
        Codebook.load(tmp_path / "absent.npz")


def test_non_finite_centroids_are_rejected():
    with pytest.raises(ValueError, match="NaN or infinite"):
        Codebook(centroids=np.full((2, 3), np.nan), encoder_id="e", seed=0, train_count=2, cluster_sizes=[1, 1])
