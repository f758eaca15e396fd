#!/usr/bin/env bash
# The brief's claim, measured: ELECTRA (replaced-token detection) against
# BERT's masked LM (80/10/10) at equal pre-training wall time on this
# machine, one after the other, with the same discriminator shape, the same
# tokens per batch and the same engine; then each at ¼, ½ and all of that
# time fine-tuned on SST-2 (the first 3,000 training sentences, 3 seeds) and
# CoNLL-2003 (1 seed), dev accuracy / F1 against pre-training minutes, with
# the untrained initialisation as minute 0. scripts/electra-probe.py then
# probes each checkpoint (masked-LM and replaced-token-detection skill).
#
#   scripts/electra-vs-bert.sh                 # 60 minutes each (the bar)
#   MINUTES=8 SEEDS=0 scripts/electra-vs-bert.sh   # a pilot
#
# Each objective first runs 25 steps to measure its step rate here; its run
# then has as many steps as fit in MINUTES (so each learning-rate schedule
# ends with its run), checkpoints at each quarter. Both run on ENGINE
# (default auto: the fast engine runs both objectives, so each gets the
# steps bertha's best engine gives it here and the objective is the only
# difference; ENGINE=candle compares them on the general path).
#
# Env: MINUTES (60), CONFIG (mini), SEEDS ("0 1 2"), TASKS ("sst2 conll"),
# ENGINE (auto), BERT_ENGINE (ENGINE), LR (5e-4), OUT (.cache/electra-vs-bert),
# DATA (../shared/data). Results: OUT/results.jsonl (one line per
# fine-tuning), OUT/summary.md (the table), OUT/score-vs-minutes.png (the chart).
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data}
MINUTES=${MINUTES:-60}
CONFIG=${CONFIG:-mini}
SEEDS=${SEEDS:-0 1 2}
TASKS=${TASKS:-sst2 conll}
ENGINE=${ENGINE:-auto}
BERT_ENGINE=${BERT_ENGINE:-$ENGINE}
LR=${LR:-5e-4}
OUT=${OUT:-.cache/electra-vs-bert}
VOCAB=$DATA/vocab/bert-base-uncased
HELD_OUT=$DATA/corpus/wikitext-2-raw-test.txt
mkdir -p "$OUT"
cargo build --release -p bertha-cli --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/bertha
lscpu | grep -E "Model name|Flags" | sed 's/Flags:.*\(avx512f\).*/AVX-512: yes/' > "$OUT/cpu.txt" || true

if [ ! -f "$OUT/corpus/corpus.json" ]; then
    "$BIN" prepare-corpus --corpus "$DATA/corpus/wiki_vital_en.txt" "$DATA/corpus/gutenberg" \
        --tokenizer "$VOCAB" --out "$OUT/corpus" --overwrite
fi

# pretrain OBJECTIVE ENGINE OUT STEPS EVERY: batch 32 × 128, AdamW LR.
pretrain() {
    local objective=$1 engine=$2 out=$3 steps=$4 every=$5
    "$BIN" pretrain --objective "$objective" --engine "$engine" --corpus "$OUT/corpus" \
        --config "$CONFIG" --tokenizer "$VOCAB" --out "$out" --steps "$steps" \
        --batch-size 32 --seq-len 128 --lr "$LR" --seed 0 --eval-corpus "$HELD_OUT" \
        --eval-size 256 --eval-every "$every" --save-every "$every" --overwrite
}

# elapsed DIR STEP: seconds from the run's start to the end of step STEP.
elapsed() {
    python3 - "$1/metrics.jsonl" "$2" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("step") == int(sys.argv[2]) and "loss" in m:
        print(m["elapsed_s"])
        break
PY
}

for objective in mlm electra; do
    engine=$ENGINE
    [ "$objective" = mlm ] && engine=$BERT_ENGINE
    run=$OUT/$objective
    if [ ! -f "$run/model.safetensors" ]; then
        # The step rate after 5 warm-up steps, on this machine, now.
        pretrain "$objective" "$engine" "$OUT/calibrate-$objective" 25 25
        t5=$(elapsed "$OUT/calibrate-$objective" 5)
        t25=$(elapsed "$OUT/calibrate-$objective" 25)
        quarter=$(python3 -c "print(max(1, int($MINUTES * 60 / 4 * 20 / ($t25 - $t5))))")
        echo "$objective: $(python3 -c "print(round(20 / ($t25 - $t5), 3))") steps/s → $((4 * quarter)) steps in $MINUTES min" | tee -a "$OUT/plan.txt"
        pretrain "$objective" "$engine" "$run" $((4 * quarter)) "$quarter"
    fi
    # Minute 0: the same model as initialised (seed 0), one step at learning
    # rate 0, the baseline that shows what pre-training adds.
    if [ ! -f "$OUT/init-$objective/model.safetensors" ]; then
        "$BIN" pretrain --objective "$objective" --engine "$engine" --corpus "$OUT/corpus" \
            --config "$CONFIG" --tokenizer "$VOCAB" --out "$OUT/init-$objective" --steps 1 \
            --batch-size 32 --seq-len 128 --lr 0 --seed 0 --overwrite >/dev/null
    fi
done

# finetune_score TASK MODEL SEED OUTDIR: the dev score of one fine-tuning
# (a finished one, with its eval_results.json, is read again, so a stopped
# run of this script resumes where it was).
finetune_score() {
    local task=$1 model=$2 seed=$3 dir=$4
    local metric=accuracy
    [ "$task" = conll ] && metric=f1
    if [ -f "$dir/eval_results.json" ]; then
        python3 -c "import json; print(json.load(open('$dir/eval_results.json'))['$metric'])"
        return
    fi
    case $task in
    sst2)
        "$BIN" finetune --task classification --model "$model" --train "$DATA/sst2/train.tsv" \
            --dev "$DATA/sst2/dev.tsv" --max-train 3000 --out "$dir" --epochs 3 --lr 1e-4 \
            --weight-decay 0.01 --warmup-ratio 0.1 --batch-size 32 --max-length 64 --seed "$seed" \
            --overwrite >/dev/null 2>&1
        python3 -c "import json; print(json.load(open('$dir/eval_results.json'))['accuracy'])"
        ;;
    conll)
        "$BIN" finetune --task ner --model "$model" --train "$DATA/conll2003/train.txt" \
            --dev "$DATA/conll2003/valid.txt" --out "$dir" --epochs 1 --lr 1e-4 --batch-size 32 \
            --max-length 128 --seed "$seed" --group-by-length --overwrite >/dev/null 2>&1
        python3 -c "import json; print(json.load(open('$dir/eval_results.json'))['f1'])"
        ;;
    esac
}

: > "$OUT/results.jsonl"
for objective in mlm electra; do
    run=$OUT/$objective
    last=$(ls -d "$run"/checkpoint-* | sed 's/.*checkpoint-//' | sort -n | tail -1)
    total=$(elapsed "$run" "$last")
    for fraction in 0 0.25 0.5 1; do
        step=$(python3 -c "print(int($last * $fraction))")
        ck=$run/checkpoint-$step
        minutes=0
        if [ "$step" = 0 ]; then
            ck=$OUT/init-$objective
        else
            minutes=$(python3 -c "print(round($(elapsed "$run" "$step") / 60, 2))")
        fi
        for task in $TASKS; do
            seeds=$SEEDS
            [ "$task" = conll ] && seeds=${SEEDS%% *}
            for seed in $seeds; do
                score=$(finetune_score "$task" "$ck" "$seed" "$OUT/ft/$objective-$step-$task-$seed")
                echo "{\"objective\":\"$objective\",\"fraction\":$fraction,\"step\":$step,\"minutes\":$minutes,\"total_minutes\":$(python3 -c "print(round($total / 60, 2))"),\"task\":\"$task\",\"seed\":$seed,\"score\":$score}" \
                    | tee -a "$OUT/results.jsonl"
            done
        done
    done
done

# The table, and per task one chart of the seed-mean score against minutes
# (as metrics lines `bertha curves` draws: step = minutes).
python3 - "$OUT" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/results.jsonl")]
groups = {}
for r in rows:
    groups.setdefault((r["task"], r["objective"], r["fraction"]), []).append(r)
lines = ["| task | objective | share of the time | minutes | step | score (mean ± sd over seeds) |",
         "|---|---|---|---|---|---|"]
for (task, obj, frac), rs in sorted(groups.items()):
    scores = [r["score"] for r in rs]
    sd = statistics.stdev(scores) if len(scores) > 1 else 0.0
    lines.append(f"| {task} | {obj} | {frac} | {rs[0]['minutes']} | {rs[0]['step']} | "
                 f"{statistics.mean(scores):.4f} ± {sd:.4f} (n={len(scores)}) |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
for (task, obj, frac), rs in groups.items():
    d = f"{out}/curves/{task}/{obj}"
    os.makedirs(d, exist_ok=True)
for task in {t for t, _, _ in groups}:
    for obj in {o for _, o, _ in groups}:
        pts = sorted((rs[0]["minutes"], statistics.mean(r["score"] for r in rs))
                     for (t, o, f), rs in groups.items() if t == task and o == obj)
        with open(f"{out}/curves/{task}/{obj}/metrics.jsonl", "w") as f:
            for minutes, score in pts:
                f.write(json.dumps({"step": minutes, "score": score}) + "\n")
PY
# One chart: each task's curve for each objective.
runs=()
for task in $TASKS; do
    runs+=("$task BERT MLM=$OUT/curves/$task/mlm" "$task ELECTRA=$OUT/curves/$task/electra")
done
"$BIN" curves --metric score --out "$OUT/score-vs-minutes.png" --x-label "pre-training minutes" \
    --title "dev score (SST-2 accuracy, CoNLL-2003 F1) against pre-training time" "${runs[@]}"
