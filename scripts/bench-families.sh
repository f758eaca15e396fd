#!/usr/bin/env bash
# RoBERTa and DistilBERT training steps side by side, in one session: bertha
# on the fast engine against transformers at its best practice here
# (scripts/anchor_family_train.py), from the same random-weight model
# folders of BERT's preset shapes (made by transformers, with the
# bert-base-uncased vocabulary):
#
#   mlm       masked-LM pre-training steps, 32 x 128 tokens, 15 % masked,
#             AdamW 5e-4; PyTorch with the decoder on masked rows only;
#             tokens/s of the steps after the first three
#   classify  SST-2 fine-tuning, 3,000 sentences, batch 32, max length 64,
#             one epoch; real (unpadded) tokens/s over the epoch
#
# and each run's peak RSS.
#
#   scripts/bench-families.sh
#   FAMILIES=roberta PRESETS=mini TASKS=mlm RUNS=fast-f32 MODES=fp32 scripts/bench-families.sh
#   REPEATS=3 RUNS="fast-f32 fast-f32:avx2" MODES="fp32 fp32:avx2" scripts/bench-families.sh
#
# RUNS: bertha's engine-precision runs (fast-f32, fast-bf16, candle-f32);
# MODES: the anchor's (fp32, bf16: torch.autocast). RUN:ISA runs bertha
# under BERTHA_ISA=ISA and MODE:avx2 holds PyTorch to AVX2
# (scripts/isa-env.sh); a run held to an ISA is compared with the anchor
# held to the same one where there is such an anchor. REPEATS: whole rounds,
# reported as medians with each round's ratio. Needs a release build (made
# here) and the Python environment of ../shared/bench/README.md in ~/.refenv
# (REFENV=... overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/isa-env.sh

DATA=${DATA:-../shared/data}
REFENV=${REFENV:-$HOME/.refenv}
FAMILIES=${FAMILIES:-roberta distilbert}
PRESETS=${PRESETS:-mini small}
TASKS=${TASKS:-mlm classify}
STEPS=${STEPS:-10}
MAX_TRAIN=${MAX_TRAIN:-3000}
RUNS=${RUNS:-fast-f32}
MODES=${MODES:-fp32}
REPEATS=${REPEATS:-1}
VOCAB=$DATA/vocab/bert-base-uncased/vocab.txt
OUT=.cache/bench/families
ANCHOR=scripts/anchor_family_train.py
PY=$REFENV/bin/python
mkdir -p "$OUT"
[ -x "$PY" ] || { echo "no Python environment in $REFENV: see ../shared/bench/README.md" >&2; exit 1; }
cargo build --release -p bertha-cli --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/bertha
# The first 3 MB of the corpus, as the anchor reads.
head -c 3000000 "$DATA/corpus/wiki_vital_en.txt" > "$OUT/corpus.txt"
: > "$OUT/results.tsv"

# bertha's tokens/s from a run's metrics.jsonl: for mlm the median of the
# steps after the first three; for classify the epoch's tokens over its time.
bertha_rate() {
    python3 - "$1" "$2" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "tokens_per_s" in r]
if sys.argv[2] == "mlm":
    tps = [r["tokens_per_s"] for r in steps[3:]] or [r["tokens_per_s"] for r in steps]
    print(f"{statistics.median(tps):.0f}")
else:
    secs = [r["elapsed_s"] - p["elapsed_s"] for p, r in zip([{"elapsed_s": 0.0}] + steps, steps)]
    tokens = sum(r["tokens_per_s"] * s for r, s in zip(steps, secs))
    print(f"{tokens / steps[-1]['elapsed_s']:.0f}")
EOF
}
# model, task, run, tokens/s, peak RSS (KB), round.
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" | tee -a "$OUT/results.tsv"; }

for round in $(seq "$REPEATS"); do
for family in $FAMILIES; do
for preset in $PRESETS; do
    model=$OUT/$family-$preset
    # A folder made before the anchors checked their tokenizer holds 5 tokens: remade.
    python3 scripts/anchor_vocab.py matches "$model" "$VOCAB" || { rm -rf "$model"; "$PY" "$ANCHOR" make "$family" "$preset" "$VOCAB" "$model"; }
    for task in $TASKS; do
        for run in $RUNS; do
            isa=$(isa_of "$run")
            engine_precision=${run%%:*}
            engine=${engine_precision%-*} precision=${engine_precision#*-}
            dir=$OUT/$family-$preset-$task-${run/:/-}
            if [ "$task" = mlm ]; then
                env $(bertha_isa_env "$isa") /usr/bin/time -f "%M" -o "$OUT/rss" "$BIN" pretrain --corpus "$OUT/corpus.txt" \
                    --init "$model" --out "$dir" --steps $((STEPS + 3)) --batch-size 32 --seq-len 128 \
                    --lr 5e-4 --eval-size 0 --eval-every 1000000 --engine "$engine" \
                    --precision "$precision" --overwrite 2>/dev/null
            else
                env $(bertha_isa_env "$isa") /usr/bin/time -f "%M" -o "$OUT/rss" "$BIN" finetune --task classification \
                    --model "$model" --train "$DATA/sst2/train.tsv" --out "$dir" \
                    --max-train "$MAX_TRAIN" --epochs 1 --lr 1e-4 --warmup-ratio 0.1 --batch-size 32 \
                    --max-length 64 --seed 0 --engine "$engine" --precision "$precision" \
                    --overwrite 2>/dev/null
            fi
            row "$family-$preset" "$task" "bertha $run" "$(bertha_rate "$dir/metrics.jsonl" "$task")" \
                "$(cat "$OUT/rss")" "$round"
        done
        for mode in $MODES; do
            torch_env=$(torch_isa_env "$(isa_of "$mode")")
            bf16=0
            [ "${mode%%:*}" = bf16 ] && bf16=1
            if [ "$task" = mlm ]; then
                line=$(env $torch_env BF16=$bf16 /usr/bin/time -f "%M" -o "$OUT/rss" "$PY" "$ANCHOR" mlm "$model" \
                    "$OUT/corpus.txt" "$STEPS" 2>"$OUT/anchor.err" | tail -1) ||
                    { echo "anchor mlm $family-$preset failed: $OUT/anchor.err" >&2; exit 1; }
                rate=$(echo "$line" | grep -o '[0-9]* tokens/s' | cut -d' ' -f1)
            else
                line=$(env $torch_env BF16=$bf16 /usr/bin/time -f "%M" -o "$OUT/rss" "$PY" "$ANCHOR" classify "$model" \
                    "$DATA/sst2" "$MAX_TRAIN" 2>"$OUT/anchor.err" | tail -1) ||
                    { echo "anchor classify $family-$preset failed: $OUT/anchor.err" >&2; exit 1; }
                rate=$(echo "$line" | grep -o 'train_tokens/s [0-9]*' | cut -d' ' -f2)
            fi
            row "$family-$preset" "$task" "pytorch $mode" "$rate" "$(cat "$OUT/rss")" "$round"
        done
    done
done
done
done

python3 - "$OUT/results.tsv" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
# (model, task, run) -> {round: (tokens/s, rss KB)}, in first-seen order.
runs = {}
for m, t, r, v, rss, rnd in rows:
    runs.setdefault((m, t, r), {})[rnd] = (float(v), int(rss))
med = {k: statistics.median(v[0] for v in by.values()) for k, by in runs.items()}
rounds = len({row[-1] for row in rows})
note = "" if rounds == 1 else "; each round's ratio in brackets"
print(f"\n{rounds} round(s): median tokens/s, ratios of the medians{note}")
print("| model | task | run | tokens/s | peak RSS GB | vs PyTorch fp32 | vs PyTorch bf16 |")
print("|---|---|---|---|---|---|---|")
for (m, t, r), by in runs.items():
    def ratio(mode):
        # A run held to an ISA against the anchor held to the same one.
        a = (m, t, f"pytorch {mode}:{r.split(':')[1]}") if ":" in r else None
        if a not in runs:
            a = (m, t, "pytorch " + mode)
        if a not in runs:
            return "-"
        text = f"{med[(m, t, r)] / med[a]:.2f}x"
        if rounds > 1:
            each = [f"{by[n][0] / runs[a][n][0]:.2f}" for n in sorted(by, key=int) if n in runs[a]]
            text += f" [{' '.join(each)}]"
        return text
    rss = max(v[1] for v in by.values())
    print(f"| {m} | {t} | {r} | {med[(m, t, r)]:,.0f} | {rss / 1e6:.2f} | {ratio('fp32')} | {ratio('bf16')} |")
EOF
