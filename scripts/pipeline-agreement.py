#!/usr/bin/env python3
"""How often the pipelines at bf16 and int8 give f32's answers, on the
public fixtures' texts and the tiny checkpoints (random weights, so the
margins between answers are small: a hard case for reduced precision).

    python3 scripts/pipeline-agreement.py [BERTHA]   # default target/release/bertha

- fill-mask (tiny/bert-mlm): top-1 token of every mask; the texts are
  pipelines.json's fill-mask cases and each sentence of sentences.txt with
  each of its words masked in turn.
- NER (tiny/bert-tokcls, aggregation simple): the entities of a text, exact
  (label, start, end) of every one; pipelines.json's NER texts and
  sentences.txt.
- QA (tiny/bert-qa): the answer span; pipelines.json's QA cases (`bertha
  qa`) and the 81 questions of finetune/squad-dev-slice.json (`bertha
  predict --task qa --max-length 64 --doc-stride 16`, the answer text).
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FX = ROOT / "tests" / "fixtures"
BERTHA = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target" / "release" / "bertha")
PRECISIONS = ["bf16", "int8"]


def run(args):
    out = subprocess.run([BERTHA, *args], capture_output=True, text=True, check=True)
    return out.stdout


def lines(args):
    return [json.loads(l) for l in run(args).splitlines() if l.strip()]


def with_texts(cmd, model, texts, extra, precision):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(texts) + "\n")
        path = f.name
    return lines([cmd, "--model", str(FX / "tiny" / model), "--input", path,
                  "--precision", precision, *extra])


def rate(same, total):
    return f"{same}/{total} ({100.0 * same / total:.1f} %)"


fx = json.loads((FX / "pipelines.json").read_text())
sentences = [l for l in (FX / "sentences.txt").read_text().splitlines() if l.strip()]

# fill-mask: top-1 per mask.
masked = [c["text"] for c in fx["fill_mask"]["cases"]]
for s in sentences:
    words = s.split()
    for i in range(len(words)):
        masked.append(" ".join(words[:i] + ["[MASK]"] + words[i + 1:]))


def top1(precision):
    out = with_texts("fill-mask", "bert-mlm", masked, ["--top-k", "1"], precision)
    return [row[0]["token"] for row in out]


want = top1("f32")
for p in PRECISIONS:
    got = top1(p)
    same = sum(g == w for g, w in zip(got, want))
    print(f"fill-mask top-1, {p}: {rate(same, len(want))} masks")

# NER: exact entity lists.
ner_texts = list(dict.fromkeys(c["text"] for c in fx["ner"]["cases"])) + sentences


def entities(precision):
    out = with_texts("ner", "bert-tokcls", ner_texts, ["--aggregation", "simple"], precision)
    return [[(e["entity_group"], e["start"], e["end"]) for e in row] for row in out]


want = entities("f32")
for p in PRECISIONS:
    got = entities(p)
    texts_same = sum(g == w for g, w in zip(got, want))
    ents = sum(len(w) for w in want)
    ents_same = sum(len(set(g) & set(w)) for g, w in zip(got, want))
    print(f"NER entities, {p}: texts with the same entities {rate(texts_same, len(want))}; "
          f"f32 entities found exactly {rate(ents_same, ents)}")


# QA: spans.
def fixture_spans(precision):
    spans = []
    for c in fx["qa"]["cases"]:
        a = lines(["qa", "--model", str(FX / "tiny" / "bert-qa"), "--question", c["question"],
                   "--context", c["context"], "--precision", precision])[0]
        spans.append((a["start"], a["end"]))
    return spans


def squad_answers(precision):
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "pred.json"
        run(["predict", "--task", "qa", "--model", str(FX / "tiny" / "bert-qa"),
             "--data", str(FX / "finetune" / "squad-dev-slice.json"), "--max-length", "64",
             "--doc-stride", "16", "--precision", precision, "--output", str(out)])
        return json.loads(out.read_text())


want_fx, want_sq = fixture_spans("f32"), squad_answers("f32")
for p in PRECISIONS:
    got_fx, got_sq = fixture_spans(p), squad_answers(p)
    same = sum(g == w for g, w in zip(got_fx, want_fx)) + sum(got_sq[k] == v for k, v in want_sq.items())
    print(f"QA span, {p}: {rate(same, len(want_fx) + len(want_sq))} questions")
