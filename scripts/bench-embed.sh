#!/usr/bin/env bash
# Side-by-side embedding benchmark: bertha against PyTorch and ONNX Runtime
# (../shared/bench/anchor_embed.py) on the same inputs, in one session, so
# the ratios hold on a machine whose speed drifts.
#
#   scripts/bench-embed.sh            # bertha and the anchors
#   BERTHA_ONLY=1 scripts/bench-embed.sh
#   BENCH_ARGS="--quantize int8" scripts/bench-embed.sh
#
# Needs a release build (made here) and, for the anchors, the Python
# environment of ../shared/bench/README.md in ~/.refenv (override with
# REFENV=...). Inputs: SST-2 dev sentences (batch 32), the first 256 SQuAD
# v1.1 dev contexts (batch 16) and 64 SST-2 sentences one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data}
ANCHOR=${ANCHOR:-../shared/bench/anchor_embed.py}
REFENV=${REFENV:-$HOME/.refenv}
MODEL=${MODEL:-.cache/models/all-MiniLM-L6-v2}
REPS=${REPS:-3}
OUT=.cache/bench
mkdir -p "$OUT"

[ -d "$MODEL" ] || scripts/fetch-model.sh
cargo build --release -p bertha-cli --quiet

python3 - "$DATA" "$OUT" <<'EOF'
import csv, json, sys
data, out = sys.argv[1], sys.argv[2]
with open(f"{data}/sst2/dev.tsv", encoding="utf-8") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
sst2 = [r["sentence"].strip() for r in rows]
open(f"{out}/sst2-dev.txt", "w", encoding="utf-8").write("\n".join(sst2) + "\n")
open(f"{out}/sst2-dev-64.txt", "w", encoding="utf-8").write("\n".join(sst2[:64]) + "\n")
squad = json.load(open(f"{data}/squad/dev-v1.1.json", encoding="utf-8"))
contexts = [" ".join(p["context"].split()) for a in squad["data"] for p in a["paragraphs"]][:256]
open(f"{out}/squad-contexts.txt", "w", encoding="utf-8").write("\n".join(contexts) + "\n")
EOF

BERTHA="${CARGO_TARGET_DIR:-target}/release/bertha"
# shellcheck disable=SC2086
run_bertha() { # file batch latency_texts
    $BERTHA bench --model "$MODEL" --input "$1" --batch-size "$2" --reps "$REPS" \
        --latency-texts "$3" ${BENCH_ARGS:-} 2>/dev/null
}
echo "== bertha (${BENCH_ARGS:-fp32})"
run_bertha "$OUT/sst2-dev.txt" 32 64 | tee "$OUT/bertha-sst2.json"
run_bertha "$OUT/squad-contexts.txt" 16 0 | tee "$OUT/bertha-squad.json"

if [ -n "${BERTHA_ONLY:-}" ]; then exit 0; fi
if [ ! -x "$REFENV/bin/python" ]; then
    echo "no Python anchors: set up $REFENV as ../shared/bench/README.md says" >&2
    exit 0
fi
echo "== anchors"
"$REFENV/bin/python" "$ANCHOR" "$MODEL" "$OUT/sst2-dev.txt" 32 "$REPS" 2>/dev/null
"$REFENV/bin/python" "$ANCHOR" "$MODEL" "$OUT/squad-contexts.txt" 16 "$REPS" 2>/dev/null
"$REFENV/bin/python" "$ANCHOR" "$MODEL" "$OUT/sst2-dev-64.txt" 1 "$REPS" 2>/dev/null
