#!/usr/bin/env bash
# The fine-tuning runs of the README's table: all-MiniLM-L6-v2 on SST-2,
# CoNLL-2003 and SQuAD v1.1 (first 80 % of the dev file's articles for
# training, the last 20 % for evaluation), in a release build. Hours of CPU
# on 2 cores; pick tasks with TASKS="sst2 conll squad".
#
#   scripts/finetune-runs.sh
#   TASKS=sst2 DATA=/path/to/data scripts/finetune-runs.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data}
MODEL=${MODEL:-.cache/models/all-MiniLM-L6-v2}
OUT=${OUT:-.cache/runs}
TASKS=${TASKS:-sst2 conll squad}
mkdir -p "$OUT/data"
[ -d "$MODEL" ] || scripts/fetch-model.sh
cargo build --release -p bertha-cli --quiet
BERTHA=target/release/bertha

for task in $TASKS; do
    case $task in
    sst2)
        "$BERTHA" finetune --task classification --model "$MODEL" \
            --train "$DATA/sst2/train.tsv" --dev "$DATA/sst2/dev.tsv" --out "$OUT/sst2" \
            --epochs 1 --lr 1e-4 --weight-decay 0.01 --warmup-ratio 0.1 --batch-size 32 \
            --max-length 64 --seed 0 --eval-every 700 --group-by-length
        ;;
    conll)
        "$BERTHA" finetune --task ner --model "$MODEL" \
            --train "$DATA/conll2003/train.txt" --dev "$DATA/conll2003/valid.txt" --out "$OUT/conll" \
            --epochs 2 --lr 1e-4 --batch-size 32 --max-length 128 --seed 0 --group-by-length
        "$BERTHA" evaluate --task ner --model "$OUT/conll" --data "$DATA/conll2003/test.txt"
        ;;
    squad)
        python3 - "$DATA/squad/dev-v1.1.json" "$OUT/data" <<'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
k = int(len(d["data"]) * 0.8)
for name, part in [("squad-train80", d["data"][:k]), ("squad-eval20", d["data"][k:])]:
    json.dump({"version": d["version"], "data": part}, open(f"{sys.argv[2]}/{name}.json", "w"))
PY
        "$BERTHA" finetune --task qa --model "$MODEL" \
            --train "$OUT/data/squad-train80.json" --dev "$OUT/data/squad-eval20.json" --out "$OUT/squad" \
            --epochs 1 --lr 1e-4 --batch-size 32 --max-length 256 --doc-stride 128 --seed 0 --group-by-length
        ;;
    *) echo "unknown task $task (sst2, conll, squad)" >&2; exit 2 ;;
    esac
done
