#!/usr/bin/env bash
# ModernBERT `mini` against BERT `mini`, pre-trained the same way from
# scratch: the same corpus, tokenizer, batch (32 × 128), learning rate and
# schedule, seed and engine (the fast engine runs both), checkpoints at the
# same steps; then each checkpoint (and each untrained initialisation)
# fine-tuned on SST-2 (the first 3,000 training sentences, 3 seeds), dev
# accuracy beside held-out masked-LM loss.
#
#   scripts/modernbert-vs-bert.sh              # to step 1,496 of a 5,984-step schedule
#   STOP=2992 scripts/modernbert-vs-bert.sh    # further along the same schedule
#
# The schedule is scripts/electra-vs-bert.sh's BERT run (5,984 steps: an
# hour of BERT `mini` on the 2-core machine of its record); when that run's
# folder is there (BERT_RUN) its checkpoints are BERT's here, else BERT is
# trained below with the same flags. A run stops once its checkpoint-STOP is
# written (the learning-rate schedule stays the full one's).
#
# Env: STEPS (5984), STOP (1496), SEEDS ("0 1 2"), LR (5e-4), ENGINE (auto),
# OUT (.cache/modernbert-vs-bert), BERT_RUN (.cache/electra-vs-bert/mlm),
# DATA (../shared/data). Results: OUT/results.jsonl, OUT/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data}
STEPS=${STEPS:-5984}
STOP=${STOP:-1496}
SEEDS=${SEEDS:-0 1 2}
LR=${LR:-5e-4}
ENGINE=${ENGINE:-auto}
OUT=${OUT:-.cache/modernbert-vs-bert}
BERT_RUN=${BERT_RUN:-.cache/electra-vs-bert/mlm}
VOCAB=$DATA/vocab/bert-base-uncased
HELD_OUT=$DATA/corpus/wikitext-2-raw-test.txt
mkdir -p "$OUT"
cargo build --release -p bertha-cli --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/bertha
lscpu | grep -E "Model name|Flags" | sed 's/Flags:.*\(avx512f\).*/AVX-512: yes/' > "$OUT/cpu.txt" || true

CORPUS=$OUT/corpus
if [ -f "$BERT_RUN/../corpus/corpus.json" ]; then
    CORPUS=$BERT_RUN/../corpus
elif [ ! -f "$CORPUS/corpus.json" ]; then
    "$BIN" prepare-corpus --corpus "$DATA/corpus/wiki_vital_en.txt" "$DATA/corpus/gutenberg" \
        --tokenizer "$VOCAB" --out "$CORPUS" --overwrite
fi

# pretrain CONFIG OUT: the schedule of STEPS steps, a checkpoint and a
# held-out evaluation every STOP steps; stopped once both are written for
# step STOP.
pretrain() {
    local config=$1 out=$2
    [ -d "$out/checkpoint-$STOP" ] && return
    "$BIN" pretrain --objective mlm --engine "$ENGINE" --corpus "$CORPUS" \
        --config "$config" --tokenizer "$VOCAB" --out "$out" --steps "$STEPS" \
        --batch-size 32 --seq-len 128 --lr "$LR" --seed 0 --eval-corpus "$HELD_OUT" \
        --eval-size 256 --eval-every "$STOP" --save-every "$STOP" --overwrite &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        if [ -f "$out/checkpoint-$STOP/trainer_state.json" ] \
            && grep -q "\"step\":$STOP,.*eval_mlm_loss" "$out/metrics.jsonl" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            break
        fi
        sleep 10
    done
    wait "$pid" 2>/dev/null || true
    [ -d "$out/checkpoint-$STOP" ] || { echo "$config: no checkpoint-$STOP" >&2; exit 1; }
}

# Minute 0: the model as initialised (seed 0), one step at learning rate 0.
init() {
    local config=$1 out=$2
    [ -f "$out/model.safetensors" ] && return
    "$BIN" pretrain --objective mlm --engine "$ENGINE" --corpus "$CORPUS" --config "$config" \
        --tokenizer "$VOCAB" --out "$out" --steps 1 --batch-size 32 --seq-len 128 --lr 0 \
        --seed 0 --overwrite >/dev/null
}

bert=$BERT_RUN
[ -d "$bert/checkpoint-$STOP" ] || { bert=$OUT/bert; pretrain mini "$bert"; }
pretrain modernbert-mini "$OUT/modernbert"
init mini "$OUT/init-bert"
init modernbert-mini "$OUT/init-modernbert"

# sst2 MODEL SEED DIR: dev accuracy (a finished fine-tuning is read again).
sst2() {
    local model=$1 seed=$2 dir=$3
    if [ ! -f "$dir/eval_results.json" ]; then
        "$BIN" finetune --task classification --model "$model" --train "$DATA/sst2/train.tsv" \
            --dev "$DATA/sst2/dev.tsv" --max-train 3000 --out "$dir" --epochs 3 --lr 1e-4 \
            --weight-decay 0.01 --warmup-ratio 0.1 --batch-size 32 --max-length 64 --seed "$seed" \
            --overwrite >/dev/null 2>&1
    fi
    python3 -c "import json; print(json.load(open('$dir/eval_results.json'))['accuracy'])"
}

# held_out RUN: the held-out masked-LM loss at step STOP.
held_out() {
    python3 - "$1/metrics.jsonl" "$STOP" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("step") == int(sys.argv[2]) and "eval_mlm_loss" in m:
        print(m["eval_mlm_loss"])
        break
else:
    print("null")
PY
}

: > "$OUT/results.jsonl"
for family in bert modernbert; do
    run=$bert
    [ "$family" = modernbert ] && run=$OUT/modernbert
    for step in 0 "$STOP"; do
        ck=$run/checkpoint-$STOP
        loss=$(held_out "$run")
        if [ "$step" = 0 ]; then
            ck=$OUT/init-$family
            loss=null
        fi
        for seed in $SEEDS; do
            score=$(sst2 "$ck" "$seed" "$OUT/ft/$family-$step-sst2-$seed")
            echo "{\"family\":\"$family\",\"step\":$step,\"held_out_mlm_loss\":$loss,\"seed\":$seed,\"sst2\":$score}" \
                | tee -a "$OUT/results.jsonl"
        done
    done
done

python3 - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/results.jsonl")]
groups = {}
for r in rows:
    groups.setdefault((r["family"], r["step"]), []).append(r)
lines = ["| model | pre-training steps | held-out MLM loss | SST-2 dev accuracy (mean ± sd over seeds) |",
         "|---|---|---|---|"]
for (family, step), rs in sorted(groups.items()):
    s = [r["sst2"] for r in rs]
    sd = statistics.stdev(s) if len(s) > 1 else 0.0
    loss = rs[0]["held_out_mlm_loss"]
    loss = "—" if loss is None else f"{loss:.3f}"
    lines.append(f"| {family} mini | {step} | {loss} | {statistics.mean(s):.4f} ± {sd:.4f} (n={len(s)}) |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
