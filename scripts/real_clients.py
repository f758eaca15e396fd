"""Real clients (openai, huggingface_hub, grpcio) against running `bertha serve`s;
each answer is compared with the bertha command's output on the same texts.
Run by scripts/real-clients.sh, which starts the servers."""
import argparse, atexit, importlib, importlib.metadata as md, json, os, shutil, subprocess, sys
import tempfile

import grpc
import numpy as np
from grpc_tools import protoc
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


def grpc_modules(proto):
    """TEI's proto (the copy bertha serves), compiled by grpcio-tools' protoc
    into a temporary folder: its messages and stubs."""
    out = tempfile.mkdtemp(prefix="bertha-grpc-")
    atexit.register(shutil.rmtree, out, True)
    proto = os.path.abspath(proto)
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    rc = protoc.main(["protoc", f"-I{os.path.dirname(proto)}", f"-I{include}",
                      f"--python_out={out}", f"--grpc_python_out={out}", proto])
    if rc != 0:
        sys.exit(f"FAIL protoc {proto}: exit {rc}")
    sys.path.insert(0, out)
    return importlib.import_module("tei_pb2"), importlib.import_module("tei_pb2_grpc")


def grpc_checks(a, want):
    """TEI's gRPC API through grpcio's generated stubs: Info, Embed,
    EmbedStream, Tokenize, Decode on the embedding server; Predict,
    PredictStream, Rerank on the classifier; an over-long input's status."""
    pb, rpc = grpc_modules(a.proto)
    ch = grpc.insecure_channel(a.grpc_embed)
    info = rpc.InfoStub(ch).Info(pb.InfoRequest())
    if (info.model_id, info.model_type) != ("minilm", pb.MODEL_TYPE_EMBEDDING):
        sys.exit(f"FAIL grpcio Info: {info}")
    print(f"ok   grpcio Info: model_id {info.model_id!r}, MODEL_TYPE_EMBEDDING, "
          f"max_input_length {info.max_input_length}")
    embed = rpc.EmbedStub(ch)
    check("grpcio Embed", [embed.Embed(pb.EmbedRequest(inputs=t)).embeddings for t in TEXTS], want)
    stream = embed.EmbedStream(iter([pb.EmbedRequest(inputs=t) for t in TEXTS]))
    check("grpcio EmbedStream", [r.embeddings for r in stream], want)
    try:
        embed.Embed(pb.EmbedRequest(inputs="word " * 300))
        sys.exit("FAIL grpcio Embed of 300 words without truncate: answered")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
            sys.exit(f"FAIL grpcio Embed of 300 words: {e.code()} {e.details()}")
        print(f"ok   grpcio Embed of 300 words without truncate: {e.code().name} ({e.details()})")

    tok = rpc.TokenizeStub(ch)
    for t, ref in zip(TEXTS, bertha(a.bertha, "tokenize", "--model", a.model, *TEXTS)):
        got = tok.Tokenize(pb.EncodeRequest(inputs=t, add_special_tokens=True)).tokens
        ids, texts = [x.id for x in got], [x.text for x in got]
        offsets = [[0, 0] if x.special else [x.start, x.stop] for x in got]
        if (ids, texts, offsets) != (ref["input_ids"], ref["tokens"], ref["offsets"]):
            sys.exit(f"FAIL grpcio Tokenize {t!r}: {got} vs {ref}")
        text = tok.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=True)).text
        if text != t.lower():
            sys.exit(f"FAIL grpcio Decode {ids}: {text!r}")
        print(f"ok   grpcio Tokenize + Decode {t[:12]!r}: {len(ids)} tokens, ids, tokens and "
              f"offsets equal, decoded back")

    ch = grpc.insecure_channel(a.grpc_classify)
    predict = rpc.PredictStub(ch)
    refs = [bertha(a.bertha, "classify", "--model", a.classifier, "--all-scores", t)[0] for t in TEXTS]
    for name, answers in [
        ("Predict", [predict.Predict(pb.PredictRequest(inputs=t)) for t in TEXTS]),
        ("PredictStream", list(predict.PredictStream(iter([pb.PredictRequest(inputs=t) for t in TEXTS])))),
    ]:
        for t, got, ref in zip(TEXTS, answers, refs):
            if [p.label for p in got.predictions] != [r["label"] for r in ref]:
                sys.exit(f"FAIL grpcio {name} {t!r} labels: {got} vs {ref}")
        check(f"grpcio {name}", [[p.score for p in g.predictions] for g in answers],
              [[r["score"] for r in ref] for ref in refs])
    query, docs = TEXTS[0], TEXTS[1:] + ["The cat lay on the rug."]
    ranks = rpc.RerankStub(ch).Rerank(pb.RerankRequest(query=query, texts=docs, return_text=True)).ranks
    # As /rerank: the score of the last label (in id order) of each (query, text) pair.
    with open(os.path.join(a.classifier, "config.json")) as f:
        id2label = json.load(f)["id2label"]
    relevant = id2label[str(len(id2label) - 1)]
    want_scores = []
    for d in docs:
        ref = bertha(a.bertha, "classify", "--model", a.classifier, "--all-scores", "--pair", d, query)[0]
        want_scores.append(next(r["score"] for r in ref if r["label"] == relevant))
    if sorted(r.index for r in ranks) != list(range(len(docs))) or any(r.text != docs[r.index] for r in ranks):
        sys.exit(f"FAIL grpcio Rerank indices / texts: {ranks}")
    if [r.score for r in ranks] != sorted((r.score for r in ranks), reverse=True):
        sys.exit(f"FAIL grpcio Rerank order: {ranks}")
    check("grpcio Rerank", [r.score for r in sorted(ranks, key=lambda r: r.index)], want_scores)


def main():
    p = argparse.ArgumentParser()
    for a in ("bertha", "model", "classifier", "embed_url", "classify_url", "similarity_url",
              "proto", "grpc_embed", "grpc_classify"):
        p.add_argument("--" + a.replace("_", "-"), required=True)
    a = p.parse_args()
    print(f"openai {md.version('openai')}, huggingface_hub {md.version('huggingface_hub')}, "
          f"grpcio {md.version('grpcio')}, grpcio-tools {md.version('grpcio-tools')}")
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

    grpc_checks(a, want)


main()
