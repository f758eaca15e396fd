#!/usr/bin/env bash
# SST-2 fine-tuning side by side, in one session: `bertha finetune --task
# classification` on the fast engine (fp32, bf16), then transformers
# (../shared/bench/anchor_sst2_finetune.py) in fp32 and under torch.autocast
# bf16, on the same 3,000 training sentences, batch 32, max length 64, one
# epoch, all-MiniLM-L6-v2. Real (unpadded) tokens per second over the whole
# epoch, as the anchor counts them (bertha: its steps' tokens over the time
# of its last step), each run's peak RSS and dev accuracy.
#
#   scripts/bench-sst2.sh
#   RUNS="fast-bf16" MODES=bf16 scripts/bench-sst2.sh
#   RUNS="fast-f32 fast-f32:avx2" MODES="fp32 fp32:avx2" scripts/bench-sst2.sh
#
# A run ENGINE-PRECISION:ISA runs under BERTHA_ISA=ISA, a mode MODE:avx2
# holds PyTorch to AVX2 (scripts/isa-env.sh), and a run held to an ISA is
# compared with the anchor held to the same one where there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/isa-env.sh

DATA=${DATA:-../shared/data}
ANCHOR=${ANCHOR:-../shared/bench/anchor_sst2_finetune.py}
MODEL=${MODEL:-.cache/models/all-MiniLM-L6-v2}
REFENV=${REFENV:-$HOME/.refenv}
MAX_TRAIN=${MAX_TRAIN:-3000}
RUNS=${RUNS:-fast-f32 fast-bf16}
MODES=${MODES:-fp32 bf16}
OUT=.cache/bench/sst2
mkdir -p "$OUT"
[ -d "$MODEL" ] || scripts/fetch-model.sh
cargo build --release -p bertha-cli --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/bertha
: > "$OUT/results.tsv"

for run in $RUNS; do
    engine_precision=${run%%:*}
    engine=${engine_precision%-*} precision=${engine_precision#*-}
    dir=$OUT/${run/:/-}
    env $(bertha_isa_env "$(isa_of "$run")") /usr/bin/time -f "%M" -o "$OUT/rss" "$BIN" finetune --task classification --model "$MODEL" \
        --train "$DATA/sst2/train.tsv" --dev "$DATA/sst2/dev.tsv" --out "$dir" \
        --max-train "$MAX_TRAIN" --epochs 1 --lr 1e-4 --warmup-ratio 0.1 --batch-size 32 \
        --max-length 64 --seed 0 --engine "$engine" --precision "$precision" --overwrite 2>/dev/null
    python3 - "$dir/metrics.jsonl" "bertha $run" "$(cat "$OUT/rss")" >> "$OUT/results.tsv" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "tokens_per_s" in r]
# Tokens over the epoch: each step's tokens/s times its time.
secs = [r["elapsed_s"] - p["elapsed_s"] for p, r in zip([{"elapsed_s": 0.0}] + steps, steps)]
tokens = sum(r["tokens_per_s"] * s for r, s in zip(steps, secs))
acc = next((r[k] for r in reversed(rows) for k in ("accuracy", "dev_accuracy") if k in r), float("nan"))
print(f"{sys.argv[2]}\t{tokens / steps[-1]['elapsed_s']:.0f}\t{int(sys.argv[3]) / 1e6:.2f}\t{acc:.4f}")
EOF
    tail -1 "$OUT/results.tsv"
done
if [ -x "$REFENV/bin/python" ]; then
    for mode in $MODES; do
        bf16=0
        [ "${mode%%:*}" = bf16 ] && bf16=1
        torch_env=$(torch_isa_env "$(isa_of "$mode")")
        line=$(env BF16=$bf16 $torch_env /usr/bin/time -f "%M" -o "$OUT/rss" "$REFENV/bin/python" \
            "$ANCHOR" "$MODEL" "$DATA/sst2" 1 "$MAX_TRAIN" 2>/dev/null | tail -1) || {
            echo "anchor $mode failed" >&2
            continue
        }
        python3 - "$line" "pytorch $mode" "$(cat "$OUT/rss")" >> "$OUT/results.tsv" <<'EOF'
import re, sys
m = re.search(r"dev_acc ([\d.]+) .*train_tokens/s (\d+)", sys.argv[1])
print(f"{sys.argv[2]}\t{float(m.group(2)):.0f}\t{int(sys.argv[3]) / 1e6:.2f}\t{float(m.group(1)):.4f}")
EOF
        tail -1 "$OUT/results.tsv"
    done
else
    echo "no Python anchor: set up $REFENV as ../shared/bench/README.md says" >&2
fi

python3 - "$OUT/results.tsv" <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
by = {r: float(t) for r, t, _, _ in rows}
print("\n| run | tokens/s | peak RSS GB | dev accuracy | vs PyTorch bf16 | vs PyTorch fp32 |")
print("|---|---|---|---|---|---|")
for r, t, rss, acc in rows:
    def ratio(a):
        # A run held to an ISA against the anchor held to the same one.
        held = f"{a}:{r.split(':')[1]}" if ":" in r else None
        a = held if held in by else a
        return f"{float(t) / by[a]:.2f}x" if a in by else "-"
    print(f"| {r} | {float(t):,.0f} | {rss} | {acc} | {ratio('pytorch bf16')} | {ratio('pytorch fp32')} |")
EOF
