#!/usr/bin/env bash
# GradCache (cached-mnrl) training speed, one after the other on this
# machine: bertha on the fast engine, bertha on candle, and
# sentence-transformers' CachedMultipleNegativesRankingLoss, each one epoch
# of all-MiniLM-L6-v2 on the first N QQP duplicate pairs (batch 32,
# mini-batches of MINI texts, lr 2e-5, max length 128, no-duplicates batches).
#
#   scripts/bench-cached-mnrl.sh            # N=640 MINI=8
#
# Env: N, MINI, MODEL (.cache/models/all-MiniLM-L6-v2), DATA (../shared/data),
# REFENV (~/.refenv: Python with sentence-transformers; skipped without it),
# OUT (.cache/bench-cached-mnrl). Prints examples/s per run.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-640}
MINI=${MINI:-8}
MODEL=${MODEL:-.cache/models/all-MiniLM-L6-v2}
DATA=${DATA:-../shared/data}
REFENV=${REFENV:-$HOME/.refenv}
OUT=${OUT:-.cache/bench-cached-mnrl}
PAIRS=$DATA/pairs/qqp_duplicate_pairs.tsv
mkdir -p "$OUT"
[ -d "$MODEL" ] || scripts/fetch-model.sh
cargo build --release -p bertha-cli --quiet
BERTHA="${CARGO_TARGET_DIR:-target}/release/bertha"
lscpu | grep 'Model name' | sed 's/ \+/ /g'

for engine in fast candle; do
    "$BERTHA" finetune --task embedding --loss cached-mnrl --mini-batch-size "$MINI" --engine "$engine" \
        --model "$MODEL" --train "$PAIRS" --max-train "$N" --out "$OUT/bertha-$engine" --batch-size 32 \
        --lr 2e-5 --warmup-ratio 0.1 --weight-decay 0.01 --max-length 128 --epochs 1 --seed 0 --overwrite \
        >/dev/null 2>&1
    python3 - "$OUT/bertha-$engine" "$N" "$engine" <<'EOF'
import json, sys
steps = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
el = steps[-1]["elapsed_s"]
print(f"bertha {sys.argv[3]}: {int(sys.argv[2]) / el:.1f} examples/s ({el:.0f} s, last loss {steps[-1]['loss']:.4f})")
EOF
done

if [ -x "$REFENV/bin/python" ]; then
    "$REFENV/bin/python" - "$MODEL" "$PAIRS" "$OUT/st" "$N" "$MINI" <<'EOF' 2>/dev/null | tail -1
import csv, sys, time
import torch
from datasets import Dataset
from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                   SentenceTransformerTrainingArguments, losses)
model_dir, pairs_path, out, n, mini = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
torch.manual_seed(0)
model = SentenceTransformer(model_dir, device="cpu")
model.max_seq_length = 128
with open(pairs_path, encoding="utf-8") as f:
    rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    next(rows)
    pairs = [(r[0], r[1]) for r in rows][:n]
ds = Dataset.from_dict({"anchor": [p[0] for p in pairs], "positive": [p[1] for p in pairs]})
loss = losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=mini)
args = SentenceTransformerTrainingArguments(output_dir=out, num_train_epochs=1, per_device_train_batch_size=32,
                                            learning_rate=2e-5, warmup_ratio=0.1, weight_decay=0.01, seed=0,
                                            save_strategy="no", report_to=[], use_cpu=True,
                                            batch_sampler="no_duplicates")
t = time.time()
SentenceTransformerTrainer(model=model, args=args, train_dataset=ds, loss=loss).train()
el = time.time() - t
print(f"sentence-transformers CachedMNRL: {len(ds) / el:.1f} examples/s ({el:.0f} s)")
EOF
fi
