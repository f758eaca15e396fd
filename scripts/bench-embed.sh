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
#   REPEATS=3 ANCHORS=ort,ort_int8 PRECISIONS="f32 int8" VARIANTS=BERTHA_AVX_VNNI=0 scripts/bench-embed.sh
#
# REPEATS=N runs the whole round (bertha's runs, then the anchors) N times
# over, alternating, and the table gives each side's median, the ratio of
# the medians and each round's ratio: this machine's speed drifts by
# 10-40 % between minutes, so one round cannot settle a ratio near a bar.
# VARIANTS adds bertha runs under other settings, beside the plain one in
# every round: a space-separated list, each a comma-separated list of
# VAR=value (e.g. `BERTHA_AVX_VNNI=0`, or `BERTHA_ISA=avx2` on an AVX-512
# CPU). ANCHORS picks the anchor's modes (default all four: st, ort,
# ort_int8, bf16; PyTorch's emulated bf16 takes minutes where the CPU has
# no bf16 instructions).
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
REPEATS=${REPEATS:-1}
VARIANTS=${VARIANTS:-}
ANCHORS=${ANCHORS:-st,ort,ort_int8,bf16}
# Each variant's settings are VAR=value (else `env` would run a setting as
# a command, and its error would go where bertha's stderr goes).
for variant in $VARIANTS; do
    IFS=, read -ra settings <<< "$variant"
    for setting in "${settings[@]}"; do
        [[ "$setting" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || {
            echo "VARIANTS: \"$setting\" (in \"$variant\") is not VAR=value" >&2
            exit 2
        }
    done
done

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
# A variant's name in file names and the table: "plain", or its settings.
variant_tag() { if [ -z "$1" ]; then echo plain; else echo "$1" | tr '=,' '-+'; fi; }
run_bertha() { # variant file batch latency_texts precision
    local settings=()
    [ -n "$1" ] && IFS=, read -ra settings <<< "$1"
    env ${settings[@]+"${settings[@]}"} "$BERTHA" bench --model "$MODEL" --input "$2" \
        --batch-size "$3" --reps "$REPS" --latency-texts "$4" --precision "$5" ${BENCH_ARGS:-} \
        2>/dev/null
}
have_anchors=1
if [ -n "${BERTHA_ONLY:-}" ]; then
    have_anchors=0
elif [ ! -x "$REFENV/bin/python" ]; then
    echo "no Python anchors: set up $REFENV as ../shared/bench/README.md says" >&2
    have_anchors=0
fi
# An anchor that fails (a missing module, say) is reported, and the table
# shows what did run.
anchor() { # round name file batch modes
    local round=$1 name=$2 file=$3 batch=$4 modes=$5
    "$REFENV/bin/python" "$ANCHOR" "$MODEL" "$file" "$batch" "$REPS" "$modes" \
        2>"$OUT/r$round/anchor-$name.err" | tee "$OUT/r$round/anchor-$name.txt" \
        || echo "anchor $name failed: $(tail -1 "$OUT/r$round/anchor-$name.err")" >&2
}

rm -rf "$OUT"/r[0-9]*
for round in $(seq "$REPEATS"); do
    mkdir -p "$OUT/r$round"
    for variant in "" $VARIANTS; do
        tag=$(variant_tag "$variant")
        for p in $PRECISIONS; do
            echo "== round $round: bertha --precision $p ($tag) ${BENCH_ARGS:-}"
            run_bertha "$variant" "$OUT/sst2-dev.txt" 32 64 "$p" \
                | tee "$OUT/r$round/bertha-$tag-$p-sst2.json"
            run_bertha "$variant" "$OUT/squad-contexts.txt" 16 0 "$p" \
                | tee "$OUT/r$round/bertha-$tag-$p-squad.json"
        done
    done
    if [ "$have_anchors" = 1 ]; then
        echo "== round $round: anchors ($ANCHOR: $ANCHORS)"
        anchor "$round" sst2 "$OUT/sst2-dev.txt" 32 "$ANCHORS"
        anchor "$round" squad "$OUT/squad-contexts.txt" 16 "$ANCHORS"
        anchor "$round" batch1 "$OUT/sst2-dev-64.txt" 1 ort
    fi
done

# The ratios the issue asks for, from this run's numbers only: each side's
# median over the rounds, the ratio of the medians, and each round's ratio.
variants=()
for variant in "" $VARIANTS; do variants+=("$(variant_tag "$variant")"); done
python3 - "$OUT" "$REPEATS" "${variants[*]}" $PRECISIONS <<'PY'
import json, re, statistics, sys
out, repeats, variants, precisions = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
rounds = range(1, repeats + 1)
anchors = {"st": "sentence-transformers", "ort": "fp32 (sorted)", "ort_int8": "dynamic int8", "bf16": "PyTorch bf16"}
peer = {"f32": "ort", "bf16": "bf16", "int8": "ort_int8"}

def anchor_lines(r, name):
    try:
        return open(f"{out}/r{r}/anchor-{name}.txt").read().splitlines()
    except OSError:
        return []

def found(r, name, key):
    """(who, texts/s, min cosine) of one anchor mode in round r, or None."""
    for l in anchor_lines(r, name):
        if anchors[key] in l:
            cos = re.search(r"min cosine to fp32 ([0-9.]+)", l)
            rate = float(re.search(r"([0-9.]+) texts/s", l).group(1))
            return l.split(":")[0], rate, cos.group(1) if cos else ""
    return None

def bertha(r, v, p, name):
    try:
        return json.load(open(f"{out}/r{r}/bertha-{v}-{p}-{name}.json"))
    except (OSError, ValueError):
        return None

med = statistics.median
print(f"\n{repeats} round(s); bertha and peer: median texts/s over the rounds (min cosine: the lowest)")
print("| input | precision | bertha variant | bertha texts/s (min cosine) | best peer at it | peer texts/s (min cosine) | ratio of medians | each round |")
print("|---|---|---|---|---|---|---|---|")
for name, label in (("sst2", "SST-2 dev, batch 32"), ("squad", "SQuAD contexts, batch 16")):
    for p in precisions:
        peers = [found(r, name, peer[p]) for r in rounds]
        for v in variants:
            runs = [bertha(r, v, p, name) for r in rounds]
            if not any(runs):
                print(f"| {label} | {p} | {v} | (failed) | | | | |")
                continue
            rates = [b["texts_per_s"] for b in runs if b]
            coss = [b["min_cosine_to_f32"] for b in runs if b and b.get("min_cosine_to_f32")]
            mine = f"{med(rates):.1f}" + (f" ({min(coss):.5f})" if coss else "")
            if not any(peers):
                print(f"| {label} | {p} | {v} | {mine} | (not run) | | | |")
                continue
            who = next(x for x in peers if x)[0]
            prates = [x[1] for x in peers if x]
            pcos = [x[2] for x in peers if x and x[2]]
            theirs = f"{med(prates):.1f}" + (f" ({min(pcos)})" if pcos else "")
            each = ", ".join(f"{b['texts_per_s'] / x[1]:.2f}" for b, x in zip(runs, peers) if b and x)
            print(f"| {label} | {p} | {v} | {mine} | {who} | {theirs} | {med(rates) / med(prates):.2f}x | {each} |")
# Batch 1: bertha's p50 over 64 sentences one at a time against ONNX Runtime's
# mean on the same 64.
ort_ms = []
for r in rounds:
    line = next((l for l in anchor_lines(r, "batch1") if "fp32 (sorted)" in l), None)
    ort_ms.append(float(re.search(r"best ([0-9.]+)s", line).group(1)) / 64 * 1000 if line else None)
if any(ort_ms):
    theirs = med([m for m in ort_ms if m])
    for p in precisions:
        for v in variants:
            runs = [bertha(r, v, p, "sst2") for r in rounds]
            p50 = [b["batch1_p50_ms"] for b in runs if b and b.get("batch1_p50_ms")]
            if not p50:
                continue
            each = ", ".join(f"{b['batch1_p50_ms'] / m:.2f}" for b, m in zip(runs, ort_ms)
                             if b and b.get("batch1_p50_ms") and m)
            print(f"| 64 SST-2 sentences one at a time | {p} | {v} | p50 {med(p50):.2f} ms | "
                  f"ONNX Runtime fp32, mean | {theirs:.2f} ms | {med(p50) / theirs:.2f}x of its time | {each} |")
PY
