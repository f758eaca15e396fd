"""transformers' ModernBERT at its CPU best, the anchor of scripts/bench-modernbert.sh: ModernBertModel with
attn_implementation="sdpa" (transformers' fastest CPU path: it computes the full n × n scores and masks the sliding
window), texts sorted by length, mean pooling, fp32 and bf16 autocast; best of REPS wall times.

usage: python scripts/anchor_modernbert.py MODEL_DIR TEXTS_FILE MAX_LENGTH BATCH REPS [fp32,bf16]
       python scripts/anchor_modernbert.py MODEL_DIR --long N REPS [fp32|bf16]
         (one text of exactly N tokens; prints seconds and the process's peak RSS in MiB)
"""
import os
import resource
import sys
import time

import torch
from transformers import AutoTokenizer, ModernBertModel

model_dir = sys.argv[1]
torch.set_num_threads(os.cpu_count())
tok = AutoTokenizer.from_pretrained(model_dir)
model = ModernBertModel.from_pretrained(model_dir, attn_implementation="sdpa").eval()


def run(batches, bf16):
    outs = []
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for e in batches:
            h = model(**e).last_hidden_state.float()
            m = e["attention_mask"][..., None].float()
            outs.append((h * m).sum(1) / m.sum(1))
    return outs


def best(f, reps):
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return min(ts)


if sys.argv[2] == "--long":
    n, reps = int(sys.argv[3]), int(sys.argv[4])
    precision = sys.argv[5] if len(sys.argv) > 5 else "fp32"
    ids = torch.randint(10, len(tok), (1, n))
    ids[0, 0], ids[0, -1] = tok.cls_token_id, tok.sep_token_id
    e = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    t = best(lambda: run([e], precision == "bf16"), reps)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"transformers {precision} sdpa: one text of {n} tokens, best {t:.3f}s, peak RSS {rss:.0f} MiB", flush=True)
    sys.exit(0)

texts_file, max_length, batch, reps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
which = sys.argv[6].split(",") if len(sys.argv) > 6 else ["fp32", "bf16"]
texts = [l.rstrip("\n") for l in open(texts_file, encoding="utf-8") if l.strip()]
texts.sort(key=len, reverse=True)
batches = [tok(texts[i:i + batch], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
           for i in range(0, len(texts), batch)]
tokens = sum(int(e["attention_mask"].sum()) for e in batches)
for w in which:
    t = best(lambda: run(batches, w == "bf16"), reps)
    print(f"transformers {torch.__version__} {w} sdpa: {len(texts)} texts ({tokens} tokens), max_length {max_length}, "
          f"batch {batch}, best {t:.3f}s, {len(texts) / t:.1f} texts/s", flush=True)
