"""A bertha-trained cross-encoder folder, loaded by sentence-transformers: its scores against `bertha rerank`'s.

usage: python check-cross-encoder.py FOLDER LISTS_JSONL [BERTHA_BIN] [QUERIES]

Loads FOLDER with sentence_transformers.CrossEncoder (as a user would), scores the first QUERIES (default 20)
candidate lists of LISTS_JSONL ({"query", "documents", "labels"} per line, as `bertha mine-negatives
--output-format labeled-list` writes), runs `bertha rerank` on the same pairs and prints the largest absolute
difference; exits 1 above 1e-5.
"""
import json
import subprocess
import sys

from sentence_transformers import CrossEncoder

folder, lists = sys.argv[1], sys.argv[2]
binary = sys.argv[3] if len(sys.argv) > 3 else "target/release/bertha"
n = int(sys.argv[4]) if len(sys.argv) > 4 else 20
ce = CrossEncoder(folder, device="cpu")
print(f"sentence-transformers loads {folder}: {type(ce).__name__}, max_length {ce.max_length}, "
      f"activation {type(ce.activation_fn).__name__}")
worst = 0.0
pairs = 0
with open(lists, encoding="utf-8") as f:
    for line, _ in zip(f, range(n)):
        row = json.loads(line)
        q, docs = row["query"], row["documents"]
        st = ce.predict([(q, d) for d in docs], convert_to_numpy=True)
        out = subprocess.run([binary, "rerank", "--model", folder, "--query", q, *docs],
                             check=True, capture_output=True, text=True).stdout
        ours = {}
        for l in out.splitlines():
            r = json.loads(l)
            ours[r["corpus_id"]] = r["score"]
        for i, s in enumerate(st):
            worst = max(worst, abs(float(s) - ours[i]))
        pairs += len(docs)
print(f"{pairs} pairs: max |sentence-transformers - bertha rerank| = {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
