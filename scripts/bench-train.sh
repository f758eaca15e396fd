#!/usr/bin/env bash
# MLM pre-training throughput side by side, in one session: `bertha pretrain`
# on the fast engine in fp32 and bf16 (and the candle engine), then
# transformers with the decoder on masked rows only in fp32 and under
# torch.autocast bf16 (../shared/bench/anchor_mlm_strong.py), on the same
# corpus, presets and shapes (seq 128, batch 32, 15 % masking, AdamW 5e-4);
# then the ratios and each run's peak RSS.
#
#   scripts/bench-train.sh                      # mini and small
#   PRESETS=mini STEPS=20 RUNS="fast-f32 fast-bf16" BERTHA_ONLY=1 scripts/bench-train.sh
#   REPEATS=3 RUNS="fast-f32 fast-bf16" scripts/bench-train.sh
#   RUNS="fast-f32 fast-bf16 fast-f32:avx2" scripts/bench-train.sh
#
# A run is ENGINE-PRECISION, and ENGINE-PRECISION:ISA runs it under
# BERTHA_ISA=ISA (the AVX2 kernels beside the AVX-512 ones, on a CPU that
# has both). A mode MODE:avx2 holds PyTorch to AVX2 (scripts/isa-env.sh),
# and a run held to an ISA is compared with the anchor held to the same
# one where the round has it:
#   RUNS="fast-f32 fast-f32:avx2" MODES="fp32-sparse fp32-sparse:avx2" scripts/bench-train.sh
#
# REPEATS=N runs the whole round (each preset: bertha's runs, then the
# anchors) N times over, alternating, and the table gives each run's median
# tokens/s, the ratios of the medians and each round's ratio: this machine's
# speed, and PyTorch's above all, drifts by 10-25 % between minutes.
#
# bertha's figure is the median tokens/s of the steps after the first three
# (the anchor times the steps after three warm-up steps), read from the
# run's metrics.jsonl. Needs a release build (made here) and, for the
# anchors, the Python environment of ../shared/bench/README.md in ~/.refenv.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/isa-env.sh

DATA=${DATA:-../shared/data}
ANCHOR=${ANCHOR:-../shared/bench/anchor_mlm_strong.py}
REFENV=${REFENV:-$HOME/.refenv}
PRESETS=${PRESETS:-mini small}
STEPS=${STEPS:-10}
RUNS=${RUNS:-fast-f32 fast-bf16 candle-f32}
REPEATS=${REPEATS:-1}
MODES=${MODES:-fp32-sparse bf16-sparse}
VOCAB=$DATA/vocab/bert-base-uncased
CORPUS=$DATA/corpus/wiki_vital_en.txt
OUT=.cache/bench/train
mkdir -p "$OUT"
cargo build --release -p bertha-cli --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/bertha
# The first 3 MB of the corpus, as the anchor reads.
head -c 3000000 "$CORPUS" > "$OUT/corpus.txt"
: > "$OUT/results.tsv"

for round in $(seq "$REPEATS"); do
for preset in $PRESETS; do
    for run in $RUNS; do
        isa=$(isa_of "$run")
        engine_precision=${run%%:*}
        engine=${engine_precision%-*} precision=${engine_precision#*-}
        dir=$OUT/$preset-${run/:/-}
        rm -rf "$dir"
        env $(bertha_isa_env "$isa") /usr/bin/time -f "%M" -o "$OUT/rss" "$BIN" pretrain --corpus "$OUT/corpus.txt" \
            --config "$preset" --tokenizer "$VOCAB" --out "$dir" --steps $((STEPS + 3)) \
            --batch-size 32 --seq-len 128 --lr 5e-4 --eval-size 0 --eval-every 1000000 \
            --engine "$engine" --precision "$precision" 2>/dev/null
        python3 - "$dir/metrics.jsonl" "$preset" "bertha $run" "$(cat "$OUT/rss")" "$round" >> "$OUT/results.tsv" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
tps = [r["tokens_per_s"] for r in rows[3:]] or [r["tokens_per_s"] for r in rows]
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{statistics.median(tps):.0f}\t{int(sys.argv[4]) / 1e6:.2f}\t{rows[-1]['loss']:.3f}\t{sys.argv[5]}")
EOF
        tail -1 "$OUT/results.tsv"
    done
    if [ -z "${BERTHA_ONLY:-}" ] && [ -x "$REFENV/bin/python" ]; then
        for mode in $MODES; do
            torch_env=$(torch_isa_env "$(isa_of "$mode")")
            line=$(env $torch_env /usr/bin/time -f "%M" -o "$OUT/rss" "$REFENV/bin/python" "$ANCHOR" "$VOCAB" \
                "$CORPUS" "$preset" "$STEPS" "${mode%%:*}" 2>/dev/null | tail -1) || {
                echo "anchor $mode failed" >&2
                continue
            }
            # "pytorch MLM mini fp32-sparse: 10 steps ... in Xs, N tokens/s, last loss L"
            python3 - "$line" "$preset" "pytorch $mode" "$(cat "$OUT/rss")" "$round" >> "$OUT/results.tsv" <<'EOF'
import re, sys
m = re.search(r"([\d.]+) tokens/s, last loss ([\d.]+)", sys.argv[1])
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{float(m.group(1)):.0f}\t{int(sys.argv[4]) / 1e6:.2f}\t{float(m.group(2)):.3f}\t{sys.argv[5]}")
EOF
            tail -1 "$OUT/results.tsv"
        done
    elif [ -z "${BERTHA_ONLY:-}" ]; then
        echo "no Python anchor: set up $REFENV as ../shared/bench/README.md says" >&2
    fi
done
done

python3 - "$OUT/results.tsv" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
# (preset, run) -> {round: (tokens/s, rss, loss)}, in first-seen order.
runs = {}
for p, r, t, rss, loss, rnd in rows:
    runs.setdefault((p, r), {})[rnd] = (float(t), rss, loss)
med = {k: statistics.median(v[0] for v in by.values()) for k, by in runs.items()}
rounds = len({row[-1] for row in rows})
note = "" if rounds == 1 else "; each round's ratio in brackets"
print(f"\n{rounds} round(s): median tokens/s, ratios of the medians{note}")
print("| preset | run | tokens/s | peak RSS GB | last loss | vs PyTorch bf16-sparse | vs PyTorch fp32-sparse |")
print("|---|---|---|---|---|---|---|")
for (p, r), by in runs.items():
    def ratio(mode):
        # A run held to an ISA against the anchor held to the same one.
        a = (p, f"pytorch {mode}:{r.split(':')[1]}") if ":" in r else None
        if a not in runs:
            a = (p, "pytorch " + mode)
        if a not in runs:
            return "-"
        text = f"{med[(p, r)] / med[a]:.2f}x"
        if rounds > 1:
            each = [f"{by[n][0] / runs[a][n][0]:.2f}" for n in sorted(by, key=int) if n in runs[a]]
            text += f" [{' '.join(each)}]"
        return text
    rss = max((v[1] for v in by.values()), key=float)
    loss = list(by.values())[-1][2]
    print(f"| {p} | {r} | {med[(p, r)]:,.0f} | {rss} | {loss} | {ratio('bf16-sparse')} | {ratio('fp32-sparse')} |")
EOF
