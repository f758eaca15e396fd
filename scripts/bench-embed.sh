#!/usr/bin/env bash
# Side-by-side embedding benchmark: bertha at each precision (f32, bf16,
# int8) against the strongest peers at their best practice
# (../shared/bench/anchor_embed_strong.py: sentence-transformers, ONNX
# Runtime fp32 and dynamic int8, PyTorch bf16 autocast, all length-sorted)
# on the same inputs, in one session, so the ratios hold on a machine whose
# speed drifts; ends with a table of each precision against its peer
# (f32 vs ONNX Runtime fp32, bf16 vs PyTorch bf16, int8 vs ONNX Runtime
# int8) and the min cosines to fp32.
#
#   scripts/bench-embed.sh                      # bertha and the anchors
#   BERTHA_ONLY=1 PRECISIONS=bf16 scripts/bench-embed.sh
#
# Needs a release build (made here) and, for the anchors, the Python
# environment of ../shared/bench/README.md in ~/.refenv (override with
# REFENV=...). Inputs: SST-2 dev sentences (batch 32), the first 256 SQuAD
# v1.1 dev contexts (batch 16) and 64 SST-2 sentences one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data}
ANCHOR=${ANCHOR:-../shared/bench/anchor_embed_strong.py}
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
PRECISIONS=${PRECISIONS:-f32 bf16 int8}
run_bertha() { # file batch latency_texts precision
    $BERTHA bench --model "$MODEL" --input "$1" --batch-size "$2" --reps "$REPS" \
        --latency-texts "$3" --precision "$4" ${BENCH_ARGS:-} 2>/dev/null
}
for p in $PRECISIONS; do
    echo "== bertha --precision $p ${BENCH_ARGS:-}"
    run_bertha "$OUT/sst2-dev.txt" 32 64 "$p" | tee "$OUT/bertha-$p-sst2.json"
    run_bertha "$OUT/squad-contexts.txt" 16 0 "$p" | tee "$OUT/bertha-$p-squad.json"
done

if [ -n "${BERTHA_ONLY:-}" ]; then exit 0; fi
if [ ! -x "$REFENV/bin/python" ]; then
    echo "no Python anchors: set up $REFENV as ../shared/bench/README.md says" >&2
    exit 0
fi
echo "== anchors ($ANCHOR)"
# An anchor that fails (a missing module, say) is reported, and the table
# shows what did run.
anchor() { # name file batch [modes]
    local name=$1 file=$2 batch=$3; shift 3
    "$REFENV/bin/python" "$ANCHOR" "$MODEL" "$file" "$batch" "$REPS" "$@" 2>"$OUT/anchor-$name.err" \
        | tee "$OUT/anchor-$name.txt" \
        || echo "anchor $name failed: $(tail -1 "$OUT/anchor-$name.err")" >&2
}
anchor sst2 "$OUT/sst2-dev.txt" 32
anchor squad "$OUT/squad-contexts.txt" 16
anchor batch1 "$OUT/sst2-dev-64.txt" 1 ort

# The ratios the issue asks for, from this run's numbers only.
python3 - "$OUT" $PRECISIONS <<'PY'
import json, re, sys
out, precisions = sys.argv[1], sys.argv[2:]
anchors = {"st": "sentence-transformers", "ort": "fp32 (sorted)", "ort_int8": "dynamic int8", "bf16": "PyTorch bf16"}
peer = {"f32": "ort", "bf16": "bf16", "int8": "ort_int8"}
print("| input | precision | bertha texts/s (min cosine) | best peer at it | peer texts/s (min cosine) | ratio |")
print("|---|---|---|---|---|---|")
for name, label in (("sst2", "SST-2 dev, batch 32"), ("squad", "SQuAD contexts, batch 16")):
    try:
        lines = open(f"{out}/anchor-{name}.txt").read().splitlines()
    except OSError:
        lines = []
    found = {}
    for key, needle in anchors.items():
        for l in lines:
            if needle in l:
                rate = float(re.search(r"([0-9.]+) texts/s", l).group(1))
                cos = re.search(r"min cosine to fp32 ([0-9.]+)", l)
                found[key] = (l.split(":")[0], rate, cos.group(1) if cos else "")
    for p in precisions:
        b = json.load(open(f"{out}/bertha-{p}-{name}.json"))
        cos = b.get("min_cosine_to_f32")
        mine = f"{b['texts_per_s']:.1f}" + (f" ({cos:.5f})" if cos else "")
        if peer[p] not in found:
            print(f"| {label} | {p} | {mine} | (not run) | | |")
            continue
        who, rate, pcos = found[peer[p]]
        theirs = f"{rate:.1f}" + (f" ({pcos})" if pcos else "")
        print(f"| {label} | {p} | {mine} | {who} | {theirs} | {b['texts_per_s'] / rate:.2f}x |")
# Batch 1: bertha's p50 over 64 sentences one at a time against ONNX Runtime's
# mean on the same 64.
try:
    line = next((l for l in open(f"{out}/anchor-batch1.txt") if "fp32 (sorted)" in l), None)
except OSError:
    line = None
if line:
    ort_ms = float(re.search(r"best ([0-9.]+)s", line).group(1)) / 64 * 1000
    for p in precisions:
        b = json.load(open(f"{out}/bertha-{p}-sst2.json"))
        print(f"| 64 SST-2 sentences one at a time | {p} | p50 {b['batch1_p50_ms']:.2f} ms | "
              f"ONNX Runtime fp32, mean | {ort_ms:.2f} ms | {b['batch1_p50_ms'] / ort_ms:.2f}x of its time |")
PY
