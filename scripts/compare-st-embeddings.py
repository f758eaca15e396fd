"""Loads a model folder in sentence-transformers and compares its embeddings of TEXTS (one per line) with
`bertha embed`'s JSON Lines output for the same texts: prints the max absolute difference and the min cosine.

usage: python scripts/compare-st-embeddings.py MODEL_DIR TEXTS_FILE BERTHA_JSONL [PROMPT_NAME]
"""
import json
import sys

import numpy as np
from sentence_transformers import SentenceTransformer

model_dir, texts_file, bertha_file = sys.argv[1:4]
prompt_name = sys.argv[4] if len(sys.argv) > 4 else None
texts = open(texts_file, encoding="utf-8").read().splitlines()
ours = np.array([json.loads(line)["embedding"] for line in open(bertha_file, encoding="utf-8")], dtype=np.float32)
theirs = SentenceTransformer(model_dir, device="cpu").encode(texts, prompt_name=prompt_name, convert_to_numpy=True)
if ours.shape != theirs.shape:
    sys.exit(f"shapes differ: bertha {ours.shape}, sentence-transformers {theirs.shape}")
cos = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
print(f"{len(texts)} texts: max abs diff {np.abs(ours - theirs).max():.2e}, min cosine {cos.min():.8f}")
