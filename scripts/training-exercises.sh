#!/usr/bin/env bash
# The training exercises of the README, in a release build (about 1.5 hours on
# 2 cores for all parts; pick some with PARTS):
#
#   bf16      `mini` pre-trained 300 steps in fp32 and in bf16: held-out MLM loss
#   sst2      all-MiniLM-L6-v2 fine-tuned on 3,000 SST-2 sentences, seeds 0 1 2,
#             fp32 and bf16: dev accuracy
#   map       [CLS] t-SNE maps of 200 + 200 SST-2 dev sentences before and after
#             that fine-tuning (seed 0, fp32), with silhouette and 10-NN figures
#   ablation  `mini` pre-trained 1,000 steps with --mask-split 80/10/10, 100/0/0,
#             0/0/100 and 50/50/0, held-out MLM loss scored with 80/10/10 masks
#             at one seed (every ABLATION_EVAL_EVERY=200 steps); one chart of
#             the four curves
#
#   scripts/training-exercises.sh
#   PARTS="bf16 sst2" scripts/training-exercises.sh
#
# Pre-training reads ../shared/data/corpus (the Wikipedia vital articles and the
# Gutenberg books, prepared once) and is scored on WikiText-2's test split.
# Results land in .cache/exercises/ (metrics.jsonl per run, summary lines in
# results.jsonl, pictures in docs/).
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data}
MODEL=${MODEL:-.cache/models/all-MiniLM-L6-v2}
PARTS=${PARTS:-bf16 sst2 map ablation}
OUT=${OUT:-.cache/exercises}
VOCAB=$DATA/vocab/bert-base-uncased
HELD_OUT=$DATA/corpus/wikitext-2-raw-test.txt
mkdir -p "$OUT" docs
[ -d "$MODEL" ] || scripts/fetch-model.sh
cargo build --release -p bertha-cli --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/bertha

corpus() {
    if [ ! -f "$OUT/corpus/corpus.json" ]; then
        "$BIN" prepare-corpus --corpus "$DATA/corpus/wiki_vital_en.txt" "$DATA/corpus/gutenberg" \
            --tokenizer "$VOCAB" --out "$OUT/corpus" --overwrite
    fi
}

# pretrain NAME STEPS EVAL_EVERY [OPTIONS...]: `mini`, batch 32 × 128, AdamW 5e-4.
pretrain() {
    local name=$1 steps=$2 every=$3
    shift 3
    "$BIN" pretrain --corpus "$OUT/corpus" --config mini --tokenizer "$VOCAB" --out "$OUT/$name" \
        --steps "$steps" --batch-size 32 --seq-len 128 --lr 5e-4 --seed 0 \
        --eval-corpus "$HELD_OUT" --eval-every "$every" --overwrite "$@"
}

# last_eval DIR: the run's final held-out line.
last_eval() {
    grep '"eval_mlm_loss"' "$1/metrics.jsonl" | tail -1
}

for part in $PARTS; do
    case $part in
    bf16)
        corpus
        for p in f32 bf16; do
            pretrain "mini300-$p" 300 100 --precision "$p"
            echo "{\"part\":\"bf16\",\"precision\":\"$p\",\"eval\":$(last_eval "$OUT/mini300-$p")}" | tee -a "$OUT/results.jsonl"
        done
        ;;
    sst2)
        for p in f32 bf16; do
            for seed in 0 1 2; do
                dir=$OUT/sst2-$p-$seed
                "$BIN" finetune --task classification --model "$MODEL" \
                    --train "$DATA/sst2/train.tsv" --dev "$DATA/sst2/dev.tsv" --max-train 3000 \
                    --out "$dir" --epochs 2 --lr 1e-4 --weight-decay 0.01 --warmup-ratio 0.1 \
                    --batch-size 32 --max-length 64 --seed "$seed" --precision "$p" --overwrite
                echo "{\"part\":\"sst2\",\"precision\":\"$p\",\"seed\":$seed,\"eval\":$(grep '"accuracy"' "$dir/metrics.jsonl" | tail -1)}" | tee -a "$OUT/results.jsonl"
            done
        done
        ;;
    map)
        [ -d "$OUT/sst2-f32-0" ] || { echo "map needs the sst2 part's sst2-f32-0 run" >&2; exit 2; }
        for which in before after; do
            model=$MODEL
            [ $which = after ] && model=$OUT/sst2-f32-0
            "$BIN" embed-map --model "$model" --pooling cls --input "$DATA/sst2/dev.tsv" --per-label 200 \
                --label-names 0=negative,1=positive --method tsne --seed 0 \
                --title "SST-2 dev, [CLS] of all-MiniLM-L6-v2, $which fine-tuning on 3,000 sentences" \
                --out "docs/sst2-cls-tsne-$which.png" --coords "$OUT/sst2-cls-tsne-$which.csv" \
                | sed "s/^/{\"part\":\"map\",\"model\":\"$which\",\"map\":/; s/\$/}/" | tee -a "$OUT/results.jsonl"
        done
        ;;
    ablation)
        corpus
        for split in 80,10,10 100,0,0 0,0,100 50,50,0; do
            name=ablation-${split//,/-}
            pretrain "$name" 1000 "${ABLATION_EVAL_EVERY:-200}" --mask-split "$split" --eval-mask-split 80,10,10
            echo "{\"part\":\"ablation\",\"split\":\"$split\",\"eval\":$(last_eval "$OUT/$name")}" | tee -a "$OUT/results.jsonl"
        done
        "$BIN" curves --metric eval_mlm_loss --out docs/masking-ablation.png \
            --title "mini, 1,000 steps: held-out MLM loss (WikiText-2 test, 80/10/10 scoring) by training split" \
            "80/10/10=$OUT/ablation-80-10-10" "100/0/0=$OUT/ablation-100-0-0" \
            "0/0/100=$OUT/ablation-0-0-100" "50/50/0=$OUT/ablation-50-50-0" | tee -a "$OUT/results.jsonl"
        ;;
    *) echo "unknown part $part (bf16, sst2, map, ablation)" >&2; exit 2 ;;
    esac
done
