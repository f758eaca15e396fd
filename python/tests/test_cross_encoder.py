"""bertha.CrossEncoder against sentence-transformers' CrossEncoder.predict."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bertha
from conftest import FIXTURES, read_safetensors

CE = FIXTURES / "cross-encoder"


def pairs():
    firsts, seconds = json.loads((CE / "inputs.json").read_text())["pairs"]
    return list(zip(firsts, seconds))


def test_predict_matches_sentence_transformers():
    want = read_safetensors(CE / "expected.safetensors")["predict"]
    model = bertha.CrossEncoder(CE)
    got = model.predict(pairs())
    assert got.shape == want.shape
    assert float(np.max(np.abs(got - want))) <= 1e-5
    one = model.predict(pairs()[0])
    assert abs(float(one) - float(want[0])) <= 1e-5


def test_rank_orders_by_score():
    model = bertha.CrossEncoder(CE)
    query = pairs()[0][0]
    docs = [b for _, b in pairs()]
    scores = model.predict([(query, d) for d in docs])
    ranked = model.rank(query, docs, return_documents=True)
    assert [r["corpus_id"] for r in ranked] == list(np.argsort(-scores, kind="stable"))
    assert all(r["text"] == docs[r["corpus_id"]] for r in ranked)
    assert len(model.rank(query, docs, top_k=2)) == 2


def test_activation_by_name_and_the_folders_default():
    model = bertha.CrossEncoder(CE)
    assert model.num_labels == 1
    want = read_safetensors(CE / "expected.safetensors")["predict"]
    logits = model.predict(pairs(), activation_fn="identity")
    assert float(np.max(np.abs(1 / (1 + np.exp(-logits)) - want))) <= 1e-5
    torch_path = model.predict(pairs(), activation_fn="torch.nn.modules.activation.Sigmoid")
    assert float(np.max(np.abs(torch_path - want))) <= 1e-5


def test_bad_arguments():
    model = bertha.CrossEncoder(CE)
    with pytest.raises(ValueError, match="activation_fn `relu` is not one of"):
        model.predict([("a", "b")], activation_fn="relu")
    with pytest.raises(ValueError, match="both texts are empty"):
        model.predict([("", "")])
    with pytest.raises(FileNotFoundError):
        bertha.CrossEncoder("/no/such/reranker")
