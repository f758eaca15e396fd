"""Real clients (openai, huggingface_hub) against running `bertha serve`s; each
answer is compared with the bertha command's output on the same texts.
Run by scripts/real-clients.sh, which starts the servers."""
import argparse, importlib.metadata as md, json, subprocess, sys

import numpy as np
from huggingface_hub import InferenceClient
from openai import OpenAI

TEXTS = ["The cat sat on the mat.", "I went to the bank to deposit money.", "A man is playing a guitar."]


def bertha(binary, *args):
    out = subprocess.run([binary, *args], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def check(name, got, want, tol=1e-5):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        sys.exit(f"FAIL {name}: shape {got.shape} vs {want.shape}")
    d = float(np.abs(got - want).max())
    if d > tol:
        sys.exit(f"FAIL {name}: max |difference| {d:.2e} > {tol:.0e}")
    print(f"ok   {name}: shape {list(got.shape)}, max |difference| {d:.1e}")


def main():
    p = argparse.ArgumentParser()
    for a in ("bertha", "model", "classifier", "embed_url", "classify_url", "similarity_url"):
        p.add_argument("--" + a.replace("_", "-"), required=True)
    a = p.parse_args()
    print(f"openai {md.version('openai')}, huggingface_hub {md.version('huggingface_hub')}")
    want = np.array([l["embedding"] for l in bertha(a.bertha, "embed", "--model", a.model, *TEXTS)])

    oa = OpenAI(base_url=a.embed_url + "/v1", api_key="unused")
    r = oa.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    check("openai embeddings.create (float)", [d.embedding for d in r.data], want)
    r = oa.embeddings.create(model="minilm", input=TEXTS, encoding_format="base64")
    decoded = [np.frombuffer(__import__("base64").b64decode(d.embedding), dtype="<f4") for d in r.data]
    check("openai embeddings.create (base64)", decoded, want)
    r = oa.embeddings.create(model="minilm", input=TEXTS)  # the client's default (base64, decoded by it)
    check("openai embeddings.create (client default)", [d.embedding for d in r.data], want)
    models = [m.id for m in oa.models.list()]
    if models != ["minilm"]:
        sys.exit(f"FAIL openai models.list: {models}")
    print(f"ok   openai models.list: {models}")

    hf = InferenceClient(model=a.embed_url)
    check("huggingface_hub feature_extraction", [hf.feature_extraction(t)[0] for t in TEXTS], want)

    hf = InferenceClient(model=a.classify_url)
    for t in TEXTS:
        for kw, flags in [({}, ["--all-scores"]), ({"top_k": 1}, ["--top-k", "1"]),
                          ({"function_to_apply": "none"}, ["--all-scores", "--function", "none"])]:
            got = hf.text_classification(t, **kw)
            ref = bertha(a.bertha, "classify", "--model", a.classifier, *flags, t)[0]
            ref = ref if isinstance(ref, list) else [ref]
            if [g.label for g in got] != [r["label"] for r in ref]:
                sys.exit(f"FAIL text_classification {kw} labels: {got} vs {ref}")
            check(f"huggingface_hub text_classification {kw} {t[:12]!r}", [g.score for g in got],
                  [r["score"] for r in ref])

    hf = InferenceClient(model=a.similarity_url)
    got = hf.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    check("huggingface_hub sentence_similarity", got, want[1:] @ want[0])


main()
