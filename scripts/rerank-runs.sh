#!/usr/bin/env bash
# Retrieve-then-rerank on a pair set, the recipe of sentence-transformers'
# own cross-encoder example (../shared/bench/anchor_ce_train.py), with
# bertha: split, mine hard negatives with the bi-encoder, train a
# cross-encoder, build the bi-encoder's top-20 candidate lists for the
# held-out queries and rerank them.
#
# Usage: scripts/rerank-runs.sh [PAIRS_TSV] [OUT_DIR]
#   PAIRS_TSV  (anchor, positive) pairs with a header (default:
#              ../shared/data/pairs/qqp_duplicate_pairs.tsv)
#   OUT_DIR    where the files and models go (default: .cache/rerank-runs)
# Environment:
#   BERTHA       the binary (default: target/release/bertha, built if missing)
#   BI           the bi-encoder (default: the fetched all-MiniLM-L6-v2)
#   LOSS         bce (default), mnrl, lambda or listnet
#   TRAIN_ARGS   more `finetune` flags (default: the anchor's recipe:
#                --pos-weight 5 --batch-size 64 --lr 2e-5 --epochs 1)
#   NEGATIVES    negatives mined per query (default 5)
#   FORMAT       mined rows: labeled-pair (default; bce), n-tuple (mnrl) or
#                labeled-list (lambda, listnet)
#   MINE_ARGS    mining flags (default: the anchor's: --range-min 10
#                --range-max 100 --max-score 0.8)
#   MINED        a name for those flags in the mined file's name (default: anchor)
#   TAG          the trained model's folder name (default: ce-$LOSS)
#   SYMMETRIC    1: train on both directions of each training pair (the
#                pair sets hold duplicates and paraphrases, which read
#                both ways); the held-out queries stay as they are
#
# The split is the anchor's: the first 80 % of rows train, the last 20 %
# are the queries; the corpus is every positive of the file (training
# positives are distractors). Evaluation: each held-out query's top 20
# corpus documents by the bi-encoder, its own positives labelled 1
# (`evaluate` reports the bi-encoder's order as `list_order` beside the
# reranked scores).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
pairs="${1:-$repo/../shared/data/pairs/qqp_duplicate_pairs.tsv}"
out="${2:-$repo/.cache/rerank-runs}"
bertha="${BERTHA:-$repo/target/release/bertha}"
bi="${BI:-$repo/.cache/models/all-MiniLM-L6-v2}"
loss="${LOSS:-bce}"
negatives="${NEGATIVES:-5}"
format="${FORMAT:-labeled-pair}"
tag="${TAG:-ce-$loss}"
read -r -a mine_args <<< "${MINE_ARGS:---range-min 10 --range-max 100 --max-score 0.8}"
sym=""; [ "${SYMMETRIC:-0}" = 1 ] && sym="-both-ways"
mined="$out/mined-${MINED:-anchor}$sym-$format-$negatives.jsonl"
read -r -a train_args <<< "${TRAIN_ARGS:---pos-weight 5 --batch-size 64 --lr 2e-5 --epochs 1}"

if [ ! -x "$bertha" ]; then
  cargo build --release -p bertha-cli
fi
[ -d "$bi" ] || scripts/fetch-model.sh
mkdir -p "$out"

# The anchor's split, and the corpus (every positive, one per line).
python3 - "$pairs" "$out" "${SYMMETRIC:-0}" <<'EOF'
import csv, sys
path, out, symmetric = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
with open(path, encoding="utf-8") as f:
    rd = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(rd)
    rows = [r[:2] for r in rd if len(r) >= 2]
n = int(len(rows) * 0.8)
train = rows[:n] + ([[p, a] for a, p in rows[:n]] if symmetric else [])
for name, part in (("train.tsv", train), ("test.tsv", rows[n:])):
    with open(f"{out}/{name}", "w", encoding="utf-8") as f:
        f.write("anchor\tpositive\n")
        f.writelines(f"{a}\t{p}\n" for a, p in part)
with open(f"{out}/corpus.txt", "w", encoding="utf-8") as f:
    f.writelines(f"{p}\n" for _, p in rows)
print(f"{len(rows)} pairs: {n} train ({len(train)} rows), {len(rows) - n} test", file=sys.stderr)
EOF

if [ ! -s "$mined" ]; then
  "$bertha" mine-negatives --model "$bi" --train "$out/train.tsv" \
    --num-negatives "$negatives" "${mine_args[@]}" \
    --max-length 128 --output-format "$format" -o "$mined"
fi
if [ ! -s "$out/eval-top20.jsonl" ]; then
  "$bertha" mine-negatives --model "$bi" --train "$out/test.tsv" --corpus "$out/corpus.txt" \
    --include-positives --num-negatives 20 --range-max 20 --max-length 128 \
    --output-format labeled-list -o "$out/eval-top20.jsonl"
fi

start=$(date +%s.%N)
"$bertha" finetune --task rerank --model "$bi" --train "$mined" \
  --loss "$loss" --max-length 128 --seed 0 --out "$out/$tag" --overwrite "${train_args[@]}"
end=$(date +%s.%N)
units=$(wc -l < "$mined")
python3 -c "import sys; u, t = int(sys.argv[1]), float(sys.argv[2]) - float(sys.argv[3]); print(f'trained {u} rows in {t:.1f} s: {u / t:.1f} rows/s')" \
  "$units" "$end" "$start"
"$bertha" evaluate --task rerank --model "$out/$tag" --data "$out/eval-top20.jsonl" \
  --max-length 128 | tee "$out/$tag/rerank-eval.json"
