#!/usr/bin/env bash
# Pre-training throughput: `bertha pretrain` against transformers
# (../shared/bench/anchor_mlm_pretrain.py) on the same corpus, presets and
# shapes (seq 128, batch 32, 15% masking, AdamW), in one session.
#
#   scripts/bench-train.sh                 # mini and small, bertha and PyTorch
#   PRESETS="tiny mini" STEPS=20 BERTHA_ONLY=1 scripts/bench-train.sh
#
# bertha's figure is the median tokens/s of the steps after the first three
# (as the anchor times the steps after three warm-up steps), read from the
# run's metrics.jsonl. Needs a release build (made here) and, for the
# anchor, the Python environment of ../shared/bench/README.md in ~/.refenv.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data}
ANCHOR=${ANCHOR:-../shared/bench/anchor_mlm_pretrain.py}
REFENV=${REFENV:-$HOME/.refenv}
PRESETS=${PRESETS:-mini small}
STEPS=${STEPS:-10}
VOCAB=$DATA/vocab/bert-base-uncased
CORPUS=$DATA/corpus/wiki_vital_en.txt
OUT=.cache/bench/train
mkdir -p "$OUT"
cargo build --release -p bertha-cli --quiet

for preset in $PRESETS; do
    rm -rf "$OUT/$preset"
    # The first 3 MB of the corpus, as the anchor reads.
    head -c 3000000 "$CORPUS" > "$OUT/corpus.txt"
    target/release/bertha pretrain --corpus "$OUT/corpus.txt" --config "$preset" \
        --tokenizer "$VOCAB" --out "$OUT/$preset" --steps $((STEPS + 3)) --batch-size 32 \
        --seq-len 128 --lr 5e-4 --eval-size 0 --eval-every 1000000 2>/dev/null
    python3 - "$OUT/$preset/metrics.jsonl" "$preset" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
tps = [r["tokens_per_s"] for r in rows[3:]] or [r["tokens_per_s"] for r in rows]
print(f"bertha MLM {sys.argv[2]}: {len(tps)} timed steps of 32x128, median {statistics.median(tps):.0f} tokens/s, "
      f"last loss {rows[-1]['loss']:.2f}")
EOF
done

if [ -n "${BERTHA_ONLY:-}" ]; then exit 0; fi
if [ ! -x "$REFENV/bin/python" ]; then
    echo "no Python anchor: set up $REFENV as ../shared/bench/README.md says" >&2
    exit 0
fi
for preset in $PRESETS; do
    "$REFENV/bin/python" "$ANCHOR" "$VOCAB" "$CORPUS" "$preset" "$STEPS" 2>/dev/null
done
