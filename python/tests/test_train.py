"""bertha.train: the CLI's training loop from Python."""

from __future__ import annotations

import math

import pytest

import bertha
from conftest import FIXTURES, tiny

SST2 = FIXTURES / "finetune" / "sst2-dev-head.tsv"


def test_a_few_steps_return_finite_metrics(tmp_path, capsys):
    out = tmp_path / "run"
    m = bertha.train(
        task="classification",
        model=tiny("bert-seqcls"),
        train=SST2,
        dev=SST2,
        out=out,
        epochs=1,
        batch_size=8,
        max_train=24,
        seed=3,
    )
    assert m["total_steps"] == 3 and m["step"] == 3
    assert math.isfinite(m["loss"])
    assert [s["step"] for s in m["steps"]] == [1, 2, 3]
    assert all(math.isfinite(s["loss"]) for s in m["steps"])
    assert len(m["evals"]) == 1 and math.isfinite(m["evals"][0]["eval_loss"])
    assert "accuracy" in m["evals"][0]
    assert (out / "metrics.jsonl").exists()
    assert "3/3" in capsys.readouterr().err
    # The same seed and options give the same run (the CLI's determinism).
    again = bertha.train(
        task="classification",
        model=tiny("bert-seqcls"),
        train=SST2,
        out=tmp_path / "again",
        epochs=1,
        batch_size=8,
        max_train=24,
        seed=3,
        show_progress_bar=False,
    )
    assert again["loss"] == m["loss"]


def test_bad_options(tmp_path):
    with pytest.raises(ValueError, match="batch_sise is not an option"):
        bertha.train("classification", tiny("bert-seqcls"), SST2, out=tmp_path, batch_sise=8)
    with pytest.raises(ValueError, match="unknown task"):
        bertha.train("summaries", tiny("bert-seqcls"), SST2, out=tmp_path)
    with pytest.raises(ValueError, match="lr"):
        bertha.train("classification", tiny("bert-seqcls"), SST2, out=tmp_path, lr="fast")
    with pytest.raises(FileNotFoundError):
        bertha.train("classification", tiny("bert-seqcls"), tmp_path / "none.tsv", out=tmp_path / "o")


CROSS_ENCODER = FIXTURES / "cross-encoder"
ST_EMBEDDING = FIXTURES / "st-embedding"


def test_rerank_and_embedding_train_as_the_cli(tmp_path):
    import json

    inputs = json.loads((CROSS_ENCODER / "inputs.json").read_text())
    lists = tmp_path / "lists.jsonl"
    lists.write_text(
        "".join(
            json.dumps({"query": q, "documents": d, "labels": l}) + "\n"
            for q, d, l in zip(inputs["queries"], inputs["lists"], inputs["list_labels"])
        )
    )
    out = tmp_path / "ce"
    m = bertha.train("rerank", CROSS_ENCODER, lists, dev=lists, out=out, loss="listnet",
                     epochs=1, batch_size=2, show_progress_bar=False)
    assert m["total_steps"] == 2 and math.isfinite(m["loss"])
    assert 0.0 <= m["evals"][0]["mrr@10"] <= 100.0
    st = json.loads((out / "config_sentence_transformers.json").read_text())
    assert st["model_type"] == "CrossEncoder"
    # The trained folder reranks from Python.
    ce = bertha.CrossEncoder(out)
    assert len(ce.rank(inputs["queries"][0], inputs["lists"][0])) == 3
    with pytest.raises(ValueError, match="pos_weight"):
        bertha.train("classification", tiny("bert-seqcls"), SST2, out=tmp_path / "x", pos_weight=2.0)

    emb = json.loads((ST_EMBEDDING / "inputs.json").read_text())
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("anchor\tpositive\n" + "".join(
        f"{a}\t{p}\n" for a, p in zip(emb["anchors"], emb["positives"])))
    m = bertha.train("embedding", ST_EMBEDDING, pairs, out=tmp_path / "emb", loss="mnrl",
                     epochs=1, batch_size=4, max_length=32, show_progress_bar=False)
    assert m["step"] >= 1 and math.isfinite(m["loss"])
    assert (tmp_path / "emb" / "modules.json").exists()
