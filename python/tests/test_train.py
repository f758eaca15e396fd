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
