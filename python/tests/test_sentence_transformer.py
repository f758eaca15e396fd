"""bertha.SentenceTransformer against sentence-transformers' stored outputs."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import bertha
from conftest import FIXTURES, read_safetensors

TOL = 1e-5
ST = FIXTURES / "st-embedding"


def close(got, want, tol=TOL):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = float(np.max(np.abs(got - want)))
    assert diff <= tol, f"max abs diff {diff} > {tol}"


def test_minilm_matches_sentence_transformers(minilm_dir, minilm_fixture):
    sentences, expected = minilm_fixture
    model = bertha.SentenceTransformer(minilm_dir)
    assert model.max_seq_length == 256
    assert model.similarity_fn_name == "cosine"
    assert model.get_sentence_embedding_dimension() == 384
    want = np.stack([expected[f"sentence_embedding.{i}"] for i in range(len(sentences))])
    for batch_size in (1, 5, 32):
        got = model.encode(sentences, batch_size=batch_size)
        assert got.dtype == np.float32
        close(got, want)
    # One string gives one vector, as sentence-transformers.
    one = model.encode(sentences[0])
    assert one.shape == (384,)
    close(one, want[0])
    as_list = model.encode(sentences[:3], convert_to_numpy=False)
    assert isinstance(as_list, list) and len(as_list) == 3
    close(np.stack(as_list), want[:3])


def test_similarity_is_cosine_by_default(minilm_dir, minilm_fixture):
    sentences, expected = minilm_fixture
    model = bertha.SentenceTransformer(minilm_dir)
    emb = model.encode(sentences[:4])
    sim = model.similarity(emb, emb)
    ref = np.stack([expected[f"sentence_embedding.{i}"] for i in range(4)]).astype(np.float64)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    close(sim, ref @ ref.T)
    assert sim.shape == (4, 4)
    dot = bertha.similarity(emb[:2], emb, fn="dot")
    close(dot, emb[:2] @ emb.T)
    with pytest.raises(ValueError, match="similarity_fn_name"):
        bertha.similarity(emb, emb, fn="nope")


def st_expected():
    return read_safetensors(ST / "expected.safetensors")


def st_anchors():
    import json

    return json.loads((ST / "inputs.json").read_text())["anchors"]


def test_st_folder_embeddings_prompts_and_truncate_dim():
    want = st_expected()
    model = bertha.SentenceTransformer(ST)
    assert model.max_seq_length == 32
    assert model.prompts == {"document": "passage: ", "query": "query: "}
    close(model.encode(st_anchors()), want["embeddings.anchor"])
    close(model.encode(st_anchors(), prompt_name="query"), want["embeddings.query_prompt.anchor"])
    close(model.encode(st_anchors(), prompt="query: "), want["embeddings.query_prompt.anchor"])
    got = model.encode(st_anchors(), truncate_dim=16, normalize_embeddings=True)
    assert got.shape == (len(st_anchors()), 16)
    close(got, want["embeddings.anchor_dim16"])
    # Truncation alone keeps the first values (no renormalisation), as
    # sentence-transformers.
    close(model.encode(st_anchors(), truncate_dim=16), want["embeddings.anchor"][:, :16])
    truncated = bertha.SentenceTransformer(ST, truncate_dim=16)
    assert truncated.get_sentence_embedding_dimension() == 16
    close(truncated.encode(st_anchors(), normalize_embeddings=True), want["embeddings.anchor_dim16"])


def test_four_threads_give_the_one_thread_results(minilm_dir, minilm_fixture):
    sentences, _ = minilm_fixture
    texts = [s + f" {i}" for i in range(8) for s in sentences]
    model = bertha.SentenceTransformer(minilm_dir)
    alone = model.encode(texts, batch_size=16)
    results = [None] * 4
    errors = []

    def run(k):
        try:
            results[k] = model.encode(texts, batch_size=16)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for r in results:
        assert np.array_equal(r, alone)


def test_int8_is_close_and_float32_exact(minilm_dir, minilm_fixture):
    sentences, expected = minilm_fixture
    model = bertha.SentenceTransformer(minilm_dir)
    want = np.stack([expected[f"sentence_embedding.{i}"] for i in range(len(sentences))])
    close(model.encode(sentences, precision="float32"), want)
    q = model.encode(sentences, precision="int8")
    # Dynamic int8: approximate, the same direction.
    cos = np.sum(q * want, axis=1)
    assert np.all(cos > 0.97), cos


def test_progress_bar_and_empty_input(minilm_dir, capsys):
    model = bertha.SentenceTransformer(minilm_dir)
    out = model.encode(["a", "b", "c"], show_progress_bar=True)
    assert out.shape == (3, 384)
    assert "3/3" in capsys.readouterr().err
    assert model.encode([]).shape == (0, 384)


def test_plain_progress_bar_without_tqdm(minilm_dir, capsys, monkeypatch):
    # tqdm is optional: without it, bars are drawn on stderr by bertha.
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    model = bertha.SentenceTransformer(minilm_dir)
    model.encode(["a", "b", "c"], show_progress_bar=True)
    err = capsys.readouterr().err
    assert "Encoding: 100%" in err and "3/3" in err


def test_missing_folder_is_file_not_found():
    with pytest.raises(FileNotFoundError, match="no such directory"):
        bertha.SentenceTransformer("/no/such/model")
    with pytest.raises(FileNotFoundError, match="no such directory"):
        bertha.pipeline("fill-mask", model="/no/such/model")


def test_bad_arguments_are_value_errors(minilm_dir):
    model = bertha.SentenceTransformer(minilm_dir)
    with pytest.raises(ValueError, match="precision `fp64` is unknown"):
        model.encode(["a"], precision="fp64")
    with pytest.raises(ValueError, match="dimensions 1000 is out of range"):
        model.encode(["a"], truncate_dim=1000)
    with pytest.raises(ValueError, match="prompt"):
        model.encode(["a"], prompt_name="query")
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        model.encode(["a"], batch_size=0)
    with pytest.raises(ValueError, match="sentences must be strings"):
        model.encode([1, 2])
