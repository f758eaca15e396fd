#!/usr/bin/env bash
# ModernBERT speed, bertha beside transformers on the same weights, one after the other in one run: a random
# model of ModernBERT-base's shape (scripts/make-modernbert-base.py), SST-2 dev sentences and SQuAD contexts
# truncated at 512 tokens (texts/s, batch 32), and one text of 512, 2,048 and 8,192 tokens (seconds, peak RSS).
#
#   scripts/bench-modernbert.sh [OUT]
#   (env: PY, the Python with torch + transformers; MODEL; LENGTHS; REPS; LONG_REPS, REPS of the long texts;
#    LIMIT, the first LIMIT texts of each set, for a short run on a small or busy machine; BERTHA, a built binary)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
PY=${PY:-python3}
OUT=${1:-.cache/bench-modernbert}
MODEL=${MODEL:-.cache/models/modernbert-base-random}
LENGTHS=${LENGTHS:-512 2048 8192}
REPS=${REPS:-3}
LONG_REPS=${LONG_REPS:-$REPS}
LIMIT=${LIMIT:-}
mkdir -p "$OUT"
[ -f "$MODEL/model.safetensors" ] || "$PY" scripts/make-modernbert-base.py "$MODEL"
if [ -z "${BERTHA:-}" ]; then cargo build --release -p bertha-cli --quiet; fi
BIN=${BERTHA:-${CARGO_TARGET_DIR:-target}/release/bertha}
lscpu | grep "Model name" | tee "$OUT/cpu.txt"
cut -f1 "$DATA/sst2/dev.tsv" | tail -n +2 > "$OUT/sst2-dev.txt"
"$PY" - "$DATA/squad/dev-v1.1.json" "$OUT/squad-contexts.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
ctx = [p["context"].replace("\n", " ") for a in d["data"] for p in a["paragraphs"]]
open(sys.argv[2], "w", encoding="utf-8").write("\n".join(ctx[:320]) + "\n")
PY
if [ -n "$LIMIT" ]; then
    for f in sst2-dev squad-contexts; do head -n "$LIMIT" "$OUT/$f.txt" > "$OUT/$f.cut" && mv "$OUT/$f.cut" "$OUT/$f.txt"; done
fi
for set in sst2-dev:128 squad-contexts:512; do
    name=${set%%:*} len=${set##*:}
    for p in f32 bf16; do
        # The JSON summary line (texts_per_s, tokens, fast_path), or the refusal (bf16 needs the fast path).
        line=$("$BIN" bench --model "$MODEL" --input "$OUT/$name.txt" --max-length "$len" --batch-size 32 \
            --precision "$p" --reps "$REPS" --latency-texts 0 2>&1 | grep -E '^\{|^error' | tail -1 || true)
        echo "bertha $p $name: $line" | tee -a "$OUT/results.txt"
    done
    "$PY" scripts/anchor_modernbert.py "$MODEL" "$OUT/$name.txt" "$len" 32 "$REPS" | sed "s/^/$name: /" | tee -a "$OUT/results.txt"
done
for n in $LENGTHS; do
    "$PY" - "$MODEL" "$n" "$OUT/long-$n.txt" <<'PY'
import sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1]); n = int(sys.argv[2])
words = open("../shared/data/corpus/wiki_vital_en.txt", encoding="utf-8").read().split()
text, k = "", 0
while len(tok(text)["input_ids"]) < n:
    k += 200; text = " ".join(words[:k])
ids = tok(text, truncation=True, max_length=n)["input_ids"]
open(sys.argv[3], "w").write(tok.decode(ids[1:-1]) + "\n")
PY
    /usr/bin/time -f "%e s, peak RSS %M KiB" -o "$OUT/time-$n" \
        "$BIN" embed --model "$MODEL" --input "$OUT/long-$n.txt" --max-length "$n" > /dev/null
    echo "bertha f32: one text of $n tokens, $(cat "$OUT/time-$n") (load included)" | tee -a "$OUT/results.txt"
    "$PY" scripts/anchor_modernbert.py "$MODEL" --long "$n" "$LONG_REPS" fp32 | tee -a "$OUT/results.txt"
done
