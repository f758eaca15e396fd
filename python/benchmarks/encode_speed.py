"""Times ``encode`` on a text file's texts (one implementation per run):
``bertha`` (bertha.SentenceTransformer) or ``st`` (sentence-transformers,
torch on ``--threads`` threads). Prints one JSON line with texts/s, the
best of ``--reps`` timed passes after one warm-up pass. Used by
scripts/bench-python.sh."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time


def read_texts(path: str, column: str) -> list:
    with open(path, newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [r[column] for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("impl", choices=["bertha", "st"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--column", default="sentence")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    texts = read_texts(a.input, a.column)
    if a.impl == "bertha":
        import bertha

        model = bertha.SentenceTransformer(a.model)
        version = bertha.__version__
    else:
        import sentence_transformers
        import torch

        torch.set_num_threads(a.threads)
        model = sentence_transformers.SentenceTransformer(a.model, device="cpu")
        version = sentence_transformers.__version__
    model.encode(texts, batch_size=a.batch_size)
    best = float("inf")
    for _ in range(a.reps):
        t0 = time.perf_counter()
        out = model.encode(texts, batch_size=a.batch_size)
        best = min(best, time.perf_counter() - t0)
    assert len(out) == len(texts)
    print(json.dumps({"impl": a.impl, "version": version, "texts": len(texts),
                      "seconds": best, "texts_per_s": len(texts) / best}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
