#!/usr/bin/env bash
# Sentence-embedding training, bertha beside sentence-transformers on the
# same recipes in one session (all-MiniLM-L6-v2; batch 16 CoSENT / 32 MNRL,
# lr 2e-5, 10 % linear warmup, AdamW wd 0.01, max length 128, 1 epoch):
#
#   1. STS-B test Spearman x100 before training (bertha and sentence-transformers);
#   2. CoSENT on STS-B train, then STS-B test;
#   3. MNRL on ../shared/data/pairs/qqp_duplicate_pairs.tsv, then STS-B test;
#   4. retrieval on the held-out last 1,000 pairs of flickr8k_train_caption_pairs.tsv,
#      before and after MNRL on the other 10,985 (bertha);
#   5. sentence-transformers loads bertha's CoSENT folder: its embeddings of 200 STS-B
#      test sentences against `bertha embed`'s (scripts/compare-st-embeddings.py).
#
#   scripts/st-train-runs.sh            # everything (~40 min on 2 cores)
#   STEPS="cosent" scripts/st-train-runs.sh
#   BERTHA_ONLY=1 scripts/st-train-runs.sh
#
# sentence-transformers runs ../shared/bench/anchor_st_train.py in the Python
# environment of ../shared/bench/README.md (~/.refenv; REFENV=... overrides).
# Training speed is examples (rows) per second of training, evaluation excluded.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data}
ANCHOR=${ANCHOR:-../shared/bench/anchor_st_train.py}
REFENV=${REFENV:-$HOME/.refenv}
MODEL=${MODEL:-.cache/models/all-MiniLM-L6-v2}
STEPS=${STEPS:-"before cosent load mnrl flickr"}
OUT=.cache/st-runs
mkdir -p "$OUT"

[ -d "$MODEL" ] || scripts/fetch-model.sh
cargo build --release -p bertha-cli --quiet
BERTHA="${CARGO_TARGET_DIR:-target}/release/bertha"
STS_TEST="$DATA/stsb/sts-test.csv"
RECIPE=(--lr 2e-5 --warmup-ratio 0.1 --weight-decay 0.01 --max-length 128 --epochs 1 --seed 0 --overwrite)

# Spearman x100 of a model folder on STS-B test, by bertha / by sentence-transformers.
bertha_sts() {
  "$BERTHA" evaluate --task sts --model "$1" --data "$STS_TEST" --stsb --max-length 128 \
    | python3 -c 'import json, sys; print("%.2f" % json.load(sys.stdin)["spearman"])'
}
st_sts() {
  "$REFENV/bin/python" "$ANCHOR" eval "$1" "$STS_TEST" | awk '{print $NF}'
}
# Training examples per second of a bertha run: rows / the last step's elapsed time.
bertha_rate() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
steps = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
print(f"{int(sys.argv[2]) / steps[-1]['elapsed_s']:.1f} examples/s ({steps[-1]['elapsed_s']:.0f} s)")
EOF
}
report() { printf '%-58s %s\n' "$1" "$2" | tee -a "$OUT/results.txt"; }
st() { [ -z "${BERTHA_ONLY:-}" ]; }

echo "# $(date -u +%FT%TZ) $(lscpu | grep 'Model name' | sed 's/ \+/ /g')" >> "$OUT/results.txt"

for step in $STEPS; do
  case $step in
  before)
    report "STS-B test spearman, before: bertha" "$(bertha_sts "$MODEL")"
    st && report "STS-B test spearman, before: sentence-transformers" "$(st_sts "$MODEL")"
    ;;
  cosent)
    "$BERTHA" finetune --task embedding --loss cosent --stsb --model "$MODEL" \
      --train "$DATA/stsb/sts-train.csv" --out "$OUT/bertha-cosent" --batch-size 16 "${RECIPE[@]}"
    report "CoSENT STS-B train: bertha speed" "$(bertha_rate "$OUT/bertha-cosent" 5749)"
    report "CoSENT STS-B train: bertha STS-B test spearman" "$(bertha_sts "$OUT/bertha-cosent")"
    if st; then
      line=$("$REFENV/bin/python" "$ANCHOR" cosent "$MODEL" "$DATA/stsb/sts-train.csv" "$OUT/st-cosent" 1 | tail -1)
      report "CoSENT STS-B train: sentence-transformers speed" "$(echo "$line" | grep -o '[0-9.]* examples/s')"
      report "CoSENT STS-B train: sentence-transformers STS-B test spearman" "$(st_sts "$OUT/st-cosent")"
    fi
    ;;
  mnrl)
    "$BERTHA" finetune --task embedding --loss mnrl --model "$MODEL" \
      --train "$DATA/pairs/qqp_duplicate_pairs.tsv" --out "$OUT/bertha-mnrl" --batch-size 32 "${RECIPE[@]}"
    report "MNRL QQP pairs: bertha speed" "$(bertha_rate "$OUT/bertha-mnrl" 8747)"
    report "MNRL QQP pairs: bertha STS-B test spearman" "$(bertha_sts "$OUT/bertha-mnrl")"
    if st; then
      line=$("$REFENV/bin/python" "$ANCHOR" mnrl "$MODEL" "$DATA/pairs/qqp_duplicate_pairs.tsv" "$OUT/st-mnrl" 1 | tail -1)
      report "MNRL QQP pairs: sentence-transformers speed" "$(echo "$line" | grep -o '[0-9.]* examples/s')"
      report "MNRL QQP pairs: sentence-transformers STS-B test spearman" "$(st_sts "$OUT/st-mnrl")"
    fi
    ;;
  flickr)
    # Held out: the file's last 1,000 pairs; trained on: the 10,985 before them.
    src="$DATA/pairs/flickr8k_train_caption_pairs.tsv"
    head -n 10986 "$src" > "$OUT/flickr-train.tsv"
    { head -n 1 "$src"; tail -n 1000 "$src"; } > "$OUT/flickr-heldout.tsv"
    retrieval() {
      "$BERTHA" evaluate --task retrieval --model "$1" --data "$OUT/flickr-heldout.tsv" --max-length 128 \
        | python3 -c 'import json, sys; d = json.load(sys.stdin); print(" ".join(f"{k} {d[k]:.4f}" for k in ["recall@1", "recall@5", "recall@10", "mrr@10", "ndcg@10"]))'
    }
    report "flickr held-out retrieval, before" "$(retrieval "$MODEL")"
    "$BERTHA" finetune --task embedding --loss mnrl --model "$MODEL" \
      --train "$OUT/flickr-train.tsv" --out "$OUT/bertha-flickr" --batch-size 32 "${RECIPE[@]}"
    report "MNRL flickr train 10,985: bertha speed" "$(bertha_rate "$OUT/bertha-flickr" 10985)"
    report "flickr held-out retrieval, after MNRL" "$(retrieval "$OUT/bertha-flickr")"
    ;;
  load)
    cut -f6 "$STS_TEST" | head -n 200 > "$OUT/load-texts.txt"
    "$BERTHA" embed --model "$OUT/bertha-cosent" --input "$OUT/load-texts.txt" > "$OUT/load-bertha.jsonl"
    report "sentence-transformers loads bertha's CoSENT folder" \
      "$("$REFENV/bin/python" scripts/compare-st-embeddings.py "$OUT/bertha-cosent" "$OUT/load-texts.txt" "$OUT/load-bertha.jsonl")"
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
