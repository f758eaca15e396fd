#!/usr/bin/env bash
# QA fine-tuning at 32 × 256 side by side, in one session: `bertha finetune
# --task qa` on the fast engine (fp32, bf16) and the candle engine, then
# transformers (scripts/anchor_qa_finetune.py) in fp32 and under
# torch.autocast bf16; tokens/s (real tokens, the steps after the first
# three) and each run's peak RSS, on the first ARTICLES (1) articles of
# SQuAD v1.1 dev with all-MiniLM-L6-v2.
#
#   scripts/bench-qa.sh
#   RUNS="fast-f32" MODES=fp32 scripts/bench-qa.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data}
MODEL=${MODEL:-.cache/models/all-MiniLM-L6-v2}
REFENV=${REFENV:-$HOME/.refenv}
ARTICLES=${ARTICLES:-1}
RUNS=${RUNS:-fast-f32 fast-bf16 candle-f32}
MODES=${MODES:-fp32 bf16}
OUT=.cache/bench/qa
mkdir -p "$OUT"
[ -d "$MODEL" ] || scripts/fetch-model.sh
cargo build --release -p bertha-cli --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/bertha
python3 - "$DATA/squad/dev-v1.1.json" "$OUT/squad.json" "$ARTICLES" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
json.dump({"version": d["version"], "data": d["data"][:int(sys.argv[3])]}, open(sys.argv[2], "w"))
EOF
: > "$OUT/results.tsv"

for run in $RUNS; do
    engine=${run%-*} precision=${run#*-}
    dir=$OUT/$run
    /usr/bin/time -f "%M" -o "$OUT/rss" "$BIN" finetune --task qa --model "$MODEL" \
        --train "$OUT/squad.json" --out "$dir" --epochs 1 --lr 1e-4 --batch-size 32 \
        --max-length 256 --doc-stride 128 --seed 0 --engine "$engine" --precision "$precision" \
        --overwrite 2>/dev/null
    python3 - "$dir/metrics.jsonl" "bertha $run" "$(cat "$OUT/rss")" >> "$OUT/results.tsv" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
timed = rows[3:] or rows
# Tokens over time across the timed steps (each step's tokens/s times its time).
secs = [r["elapsed_s"] - p["elapsed_s"] for p, r in zip(rows[2:], rows[3:])] or [1.0]
toks = [r["tokens_per_s"] * s for r, s in zip(timed, secs)]
print(f"{sys.argv[2]}\t{sum(toks) / sum(secs):.0f}\t{int(sys.argv[3]) / 1e6:.2f}\t{rows[-1]['loss']:.3f}")
EOF
    tail -1 "$OUT/results.tsv"
done
if [ -x "$REFENV/bin/python" ]; then
    for mode in $MODES; do
        bf16=0
        [ "$mode" = bf16 ] && bf16=1
        line=$(BF16=$bf16 /usr/bin/time -f "%M" -o "$OUT/rss" "$REFENV/bin/python" \
            scripts/anchor_qa_finetune.py "$MODEL" "$OUT/squad.json" 256 32 2>/dev/null | tail -1) || {
            echo "anchor $mode failed" >&2
            continue
        }
        python3 - "$line" "pytorch $mode" "$(cat "$OUT/rss")" >> "$OUT/results.tsv" <<'EOF'
import re, sys
m = re.search(r"([\d.]+) tokens/s, last loss ([\d.]+)", sys.argv[1])
print(f"{sys.argv[2]}\t{float(m.group(1)):.0f}\t{int(sys.argv[3]) / 1e6:.2f}\t{float(m.group(2)):.3f}")
EOF
        tail -1 "$OUT/results.tsv"
    done
else
    echo "no Python anchor: set up $REFENV as ../shared/bench/README.md says" >&2
fi

python3 - "$OUT/results.tsv" <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
by = {r: (float(t), float(rss)) for r, t, rss, _ in rows}
print("\n| run | tokens/s | peak RSS GB | last loss | tokens/s vs PyTorch fp32 | RSS vs PyTorch fp32 |")
print("|---|---|---|---|---|---|")
for r, t, rss, loss in rows:
    a = by.get("pytorch fp32")
    tr = f"{float(t) / a[0]:.2f}x" if a else "-"
    rr = f"{float(rss) / a[1]:.2f}" if a else "-"
    print(f"| {r} | {float(t):,.0f} | {rss} | {loss} | {tr} | {rr} |")
EOF
