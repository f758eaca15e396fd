#!/usr/bin/env bash
# Multiple-choice fine-tuning on real data, beside transformers: SNLI as a
# two-choice task (the premise, and which of two hypotheses it entails:
# the entailed one or the contradicted one, in an order drawn with seed 0),
# written in SWAG's columns (sent1, ending0, ending1, label). Trains
# all-MiniLM-L6-v2 on the dev split's triplets (2,954) and scores the test
# split's (2,929), with `bertha finetune --task multiple-choice` on each
# engine in ENGINES, then with scripts/anchor_multiple_choice.py
# (transformers' AutoModelForMultipleChoice, the same recipe) when
# ~/.refenv has transformers. Prints test accuracy and training speed.
#
#   scripts/multiple-choice-runs.sh
#   ENGINES="fast candle" EPOCHS=2 scripts/multiple-choice-runs.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data}
MODEL=${MODEL:-.cache/models/all-MiniLM-L6-v2}
OUT=${OUT:-.cache/runs/multiple-choice}
ENGINES=${ENGINES:-fast}
EPOCHS=${EPOCHS:-1}
REFENV=${REFENV:-$HOME/.refenv}
RECIPE="--lr 5e-5 --batch-size 16 --max-length 64 --seed 0"
mkdir -p "$OUT"
[ -d "$MODEL" ] || scripts/fetch-model.sh
cargo build --release -p bertha-cli --quiet
BERTHA=${CARGO_TARGET_DIR:-target}/release/bertha

python3 - "$DATA/pairs/snli_devtest_triplets.tsv" "$OUT" <<'PY'
import csv, random, sys
rng = random.Random(0)
rows = list(csv.DictReader(open(sys.argv[1], encoding="utf-8"), delimiter="\t", quoting=csv.QUOTE_NONE))
for split, name in [("dev", "train"), ("test", "test")]:
    with open(f"{sys.argv[2]}/snli-choice-{name}.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sent1", "ending0", "ending1", "label"])
        for r in rows:
            if r["split"] != split:
                continue
            y = rng.randrange(2)
            endings = [r["negative"], r["positive"]] if y else [r["positive"], r["negative"]]
            w.writerow([r["anchor"], *endings, y])
PY

for engine in $ENGINES; do
    dir=$OUT/bertha-$engine
    rm -rf "$dir"
    "$BERTHA" finetune --task multiple-choice --model "$MODEL" --engine "$engine" \
        --train "$OUT/snli-choice-train.csv" --out "$dir" --epochs "$EPOCHS" $RECIPE 2>/dev/null
    score=$("$BERTHA" evaluate --task multiple-choice --model "$dir" --data "$OUT/snli-choice-test.csv")
    python3 - "$dir/metrics.jsonl" "$engine" "$score" "$OUT/snli-choice-train.csv" "$EPOCHS" <<'PY'
import csv, json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
score = json.loads(sys.argv[3])
examples = sum(1 for _ in csv.reader(open(sys.argv[4], encoding="utf-8"))) - 1
# The steps' median rate (the elapsed time of the last step includes its
# start-up and any evaluation).
rate = statistics.median(s["tokens_per_s"] for s in steps)
last = steps[-1]["elapsed_s"]
print(f"bertha {sys.argv[2]}: test accuracy {score['accuracy']:.4f}, {last:.1f} s training, "
      f"{rate:.0f} tokens/s (median step), {examples * int(sys.argv[5]) / last:.2f} examples/s")
PY
done
if [ -x "$REFENV/bin/python" ]; then
    "$REFENV/bin/python" scripts/anchor_multiple_choice.py "$MODEL" "$OUT/snli-choice-train.csv" \
        "$OUT/snli-choice-test.csv" "$EPOCHS" 2>/dev/null | tail -1
else
    echo "no transformers anchor: set up $REFENV as ../shared/bench/README.md says" >&2
fi
