#!/usr/bin/env bash
# QA fine-tuning at 32 × 256 side by side, in one session: `bertha finetune
# --task qa` on the fast engine (fp32, bf16) and the candle engine, then
# transformers (scripts/anchor_qa_finetune.py) in fp32 and under
# torch.autocast bf16; tokens/s (real tokens, the steps after the first
# three) and each run's peak RSS, on the first ARTICLES (1) articles of
# SQuAD v1.1 dev (their first QUESTIONS questions, when set) with
# all-MiniLM-L6-v2 (MODEL: another folder, e.g. a ModernBERT's).
#
#   scripts/bench-qa.sh
#   RUNS="fast-f32" MODES=fp32 scripts/bench-qa.sh
#   REPEATS=3 RUNS="fast-f32" MODES=fp32 scripts/bench-qa.sh
#   MODEL=.cache/models/modernbert-base-3l QUESTIONS=200 scripts/bench-qa.sh
#   RUNS="fast-f32 fast-bf16 fast-f32:avx2" scripts/bench-qa.sh
#
# A run is ENGINE-PRECISION, and ENGINE-PRECISION:ISA runs it under
# BERTHA_ISA=ISA (the AVX2 kernels beside the AVX-512 ones, on a CPU that
# has both). A mode MODE:avx2 holds PyTorch to AVX2 (scripts/isa-env.sh),
# and a run held to an ISA is compared with PyTorch fp32 held to the same
# one where the round has it:
#   RUNS="fast-f32 fast-f32:avx2" MODES="fp32 fp32:avx2" scripts/bench-qa.sh
#
# REPEATS=N runs the whole round (bertha's runs, then the anchors) N times
# over, alternating; the table gives each run's median tokens/s, its ratio
# to PyTorch fp32's median and each round's ratio (this machine's speed
# drifts between minutes, PyTorch's as well as bertha's).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/isa-env.sh

DATA=${DATA:-../shared/data}
MODEL=${MODEL:-.cache/models/all-MiniLM-L6-v2}
REFENV=${REFENV:-$HOME/.refenv}
ARTICLES=${ARTICLES:-1}
QUESTIONS=${QUESTIONS:-0}
RUNS=${RUNS:-fast-f32 fast-bf16 candle-f32}
MODES=${MODES:-fp32 bf16}
REPEATS=${REPEATS:-1}
OUT=.cache/bench/qa
mkdir -p "$OUT"
[ -d "$MODEL" ] || scripts/fetch-model.sh
cargo build --release -p bertha-cli --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/bertha
python3 - "$DATA/squad/dev-v1.1.json" "$OUT/squad.json" "$ARTICLES" "$QUESTIONS" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
# QUESTIONS=0: every question of the articles (a slice needs an int, not inf).
data, left = d["data"][:int(sys.argv[3])], int(sys.argv[4]) or sum(
    len(p["qas"]) for a in d["data"] for p in a["paragraphs"])
for article in data:
    for para in article["paragraphs"]:
        para["qas"] = para["qas"][:max(0, left)]
        left -= len(para["qas"])
    article["paragraphs"] = [p for p in article["paragraphs"] if p["qas"]]
json.dump({"version": d["version"], "data": data}, open(sys.argv[2], "w"))
EOF
: > "$OUT/results.tsv"

for round in $(seq "$REPEATS"); do
for run in $RUNS; do
    isa=$(isa_of "$run")
    engine_precision=${run%%:*}
    engine=${engine_precision%-*} precision=${engine_precision#*-}
    dir=$OUT/${run/:/-}
    env $(bertha_isa_env "$isa") /usr/bin/time -f "%M" -o "$OUT/rss" "$BIN" finetune --task qa --model "$MODEL" \
        --train "$OUT/squad.json" --out "$dir" --epochs 1 --lr 1e-4 --batch-size 32 \
        --max-length 256 --doc-stride 128 --seed 0 --engine "$engine" --precision "$precision" \
        --overwrite 2>/dev/null
    python3 - "$dir/metrics.jsonl" "bertha $run" "$(cat "$OUT/rss")" "$round" >> "$OUT/results.tsv" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
timed = rows[3:] or rows
# Tokens over time across the timed steps (each step's tokens/s times its time).
secs = [r["elapsed_s"] - p["elapsed_s"] for p, r in zip(rows[2:], rows[3:])] or [1.0]
toks = [r["tokens_per_s"] * s for r, s in zip(timed, secs)]
print(f"{sys.argv[2]}\t{sum(toks) / sum(secs):.0f}\t{int(sys.argv[3]) / 1e6:.2f}\t{rows[-1]['loss']:.3f}\t{sys.argv[4]}")
EOF
    tail -1 "$OUT/results.tsv"
done
if [ -x "$REFENV/bin/python" ]; then
    for mode in $MODES; do
        bf16=0
        [ "${mode%%:*}" = bf16 ] && bf16=1
        torch_env=$(torch_isa_env "$(isa_of "$mode")")
        line=$(env BF16=$bf16 $torch_env /usr/bin/time -f "%M" -o "$OUT/rss" "$REFENV/bin/python" \
            scripts/anchor_qa_finetune.py "$MODEL" "$OUT/squad.json" 256 32 2>/dev/null | tail -1) || {
            echo "anchor $mode failed" >&2
            continue
        }
        python3 - "$line" "pytorch $mode" "$(cat "$OUT/rss")" "$round" >> "$OUT/results.tsv" <<'EOF'
import re, sys
m = re.search(r"([\d.]+) tokens/s, last loss ([\d.]+)", sys.argv[1])
print(f"{sys.argv[2]}\t{float(m.group(1)):.0f}\t{int(sys.argv[3]) / 1e6:.2f}\t{float(m.group(2)):.3f}\t{sys.argv[4]}")
EOF
        tail -1 "$OUT/results.tsv"
    done
else
    echo "no Python anchor: set up $REFENV as ../shared/bench/README.md says" >&2
fi

done

python3 - "$OUT/results.tsv" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
runs = list(dict.fromkeys(r[0] for r in rows))
rounds = sorted({r[4] for r in rows}, key=int)
med = statistics.median
rss = {n: max(float(r[2]) for r in rows if r[0] == n) for n in runs}
print(f"\n{len(rounds)} round(s): each run's median tokens/s, and its highest peak RSS")
print("| run | tokens/s | peak RSS GB | last loss | tokens/s vs PyTorch fp32 | each round | RSS vs PyTorch fp32 |")
print("|---|---|---|---|---|---|---|")
for n in runs:
    # A run held to an ISA against PyTorch fp32 held to the same one.
    name = f"pytorch fp32:{n.split(':')[1]}" if ":" in n else None
    if name not in runs:
        name = "pytorch fp32"
    anchor = {r[4]: float(r[1]) for r in rows if r[0] == name}
    a = med(anchor.values()) if anchor else None
    mine = [r for r in rows if r[0] == n]
    t = med(float(r[1]) for r in mine)
    tr = f"{t / a:.2f}x" if a else "-"
    each = ", ".join(f"{float(r[1]) / anchor[r[4]]:.2f}" for r in mine if r[4] in anchor) or "-"
    rr = f"{rss[n] / rss[name]:.2f}" if name in rss else "-"
    print(f"| {n} | {t:,.0f} | {rss[n]:.2f} | {mine[-1][3]} | {tr} | {each} | {rr} |")
EOF
