"""bertha.pipeline against transformers' pipelines (tests/fixtures/pipelines.json)."""

from __future__ import annotations

import numpy as np
import pytest

import bertha
from conftest import FIXTURES

# Probabilities within 1e-5 (the logits agree to 1e-4), as the Rust tests.
TOL = 1e-5


def same(got, want, path="result"):
    """Equal structure and values, floats within TOL."""
    if isinstance(want, float):
        assert abs(float(got) - want) <= TOL, f"{path}: {got} vs {want}"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{path}: {got} vs {want}"
        for k in want:
            same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{path}: {got} vs {want}"
        for i, (g, w) in enumerate(zip(got, want)):
            same(g, w, f"{path}[{i}]")
    else:
        assert got == want, f"{path}: {got!r} vs {want!r}"


def model(fx):
    return FIXTURES / fx["model"]


def test_fill_mask(pipelines_fixture):
    fx = pipelines_fixture["fill_mask"]
    fm = bertha.pipeline("fill-mask", model=model(fx), top_k=fx["top_k"])
    for case in fx["cases"]:
        same(fm(case["text"]), case["expected"], case["text"])
    texts = [c["text"] for c in fx["cases"]]
    same(fm(texts), [c["expected"] for c in fx["cases"]])


def test_text_classification(pipelines_fixture):
    fx = pipelines_fixture["classify"]
    clf = bertha.pipeline("text-classification", model=model(fx), top_k=None)
    for case in fx["cases"]:
        same(clf(case["text"]), case["expected"], case["text"])
    # transformers' default top_k=1: the best label, one dict per text.
    best = bertha.pipeline("sentiment-analysis", model=model(fx))
    same(best(fx["cases"][0]["text"]), case_best(fx["cases"][0]))
    same(best([c["text"] for c in fx["cases"]]), [case_best(c)[0] for c in fx["cases"]])


def case_best(case):
    return [max(case["expected"], key=lambda x: x["score"])]


def test_text_classification_pair(pipelines_fixture):
    fx = pipelines_fixture["classify_pair"]
    clf = bertha.pipeline("text-classification", model=model(fx), top_k=None)
    for case in fx["cases"]:
        got = clf({"text": case["text"], "text_pair": case["pair"]})
        same(got, case["expected"])
    # A list of pairs and texts: all at once, in order.
    both = [{"text": c["text"], "text_pair": c["pair"]} for c in fx["cases"]]
    both += [c["text"] for c in pipelines_fixture["classify"]["cases"]]
    want = [c["expected"] for c in fx["cases"]]
    want += [c["expected"] for c in pipelines_fixture["classify"]["cases"]]
    same(clf(both), want)


def test_token_classification(pipelines_fixture):
    fx = pipelines_fixture["ner"]
    for case in fx["cases"]:
        ner = bertha.pipeline(
            "token-classification", model=model(fx), aggregation_strategy=case["aggregation"]
        )
        same(ner(case["text"]), case["expected"], f"{case['aggregation']}: {case['text']}")
    plain = bertha.pipeline("ner", model=model(fx))
    case = fx["cases"][-1]
    same(plain(case["text"], aggregation_strategy=case["aggregation"]), case["expected"])
    # A list: all at once, each text's entities in order.
    for agg in ("none", "simple"):
        cases = [c for c in fx["cases"] if c["aggregation"] == agg]
        many = plain([c["text"] for c in cases], aggregation_strategy=agg)
        same(many, [c["expected"] for c in cases], agg)


def test_question_answering(pipelines_fixture):
    fx = pipelines_fixture["qa"]
    qa = bertha.pipeline("question-answering", model=model(fx))
    for case in fx["cases"]:
        got = qa(
            question=case["question"],
            context=case["context"],
            max_answer_len=fx["max_answer_len"],
        )
        same(got, case["expected"], case["question"])
    top = qa(question=fx["cases"][0]["question"], context=fx["cases"][0]["context"], top_k=3)
    assert len(top) == 3 and top[0]["score"] >= top[1]["score"] >= top[2]["score"]


def test_feature_extraction(minilm_dir, minilm_fixture):
    sentences, expected = minilm_fixture
    fe = bertha.pipeline("feature-extraction", model=minilm_dir)
    for i in (0, 3):
        want = expected[f"last_hidden_state.{i}"]
        got = fe(sentences[i])
        assert isinstance(got, list) and len(got) == 1
        # Hidden states: transformers' tolerance (1e-4).
        assert np.max(np.abs(np.asarray(got[0]) - want)) <= 1e-4
        t = fe(sentences[i], return_tensors=True)
        assert t.shape == (1,) + want.shape and t.dtype == np.float32


def test_unknown_task_and_bad_options(pipelines_fixture):
    with pytest.raises(ValueError, match="not one of"):
        bertha.pipeline("summarization", model=FIXTURES / "tiny" / "bert-mlm")
    fm = bertha.pipeline("fill-mask", model=FIXTURES / "tiny" / "bert-mlm")
    with pytest.raises(ValueError, match="no mask token"):
        fm("no mask here")
    ner = bertha.pipeline("ner", model=FIXTURES / "tiny" / "bert-tokcls")
    with pytest.raises(ValueError, match="unknown aggregation"):
        ner("john", aggregation_strategy="median")
