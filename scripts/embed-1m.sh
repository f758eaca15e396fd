#!/usr/bin/env bash
# `bertha embed` on 1,000,000 lines (issue 18's streaming check): peak RSS
# (/usr/bin/time -v), how the output grows in the first seconds, and
# throughput beside `bertha bench` on the first LIMIT of the same texts
# (one repetition, the same model, batch and threads).
#
# The lines are SST-2's training sentences repeated to 1,000,000.
#
#   scripts/embed-1m.sh [WORKDIR] [BENCH_LIMIT]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${1:-$(mktemp -d)}"
limit="${2:-200000}"
mkdir -p "$work"
model="$repo/.cache/models/all-MiniLM-L6-v2"
[ -d "$model" ] || "$repo/scripts/fetch-model.sh"
cargo build --release -q -p bertha-cli --manifest-path "$repo/Cargo.toml"
bertha="${CARGO_TARGET_DIR:-$repo/target}/release/bertha"
lines="$work/1m.txt"
if [ "$(wc -l <"$lines" 2>/dev/null || echo 0)" != 1000000 ]; then
  tail -n +2 "$repo/../shared/data/sst2/train.tsv" | cut -f1 >"$work/sst2.txt"
  while [ "$(wc -l <"$lines" 2>/dev/null || echo 0)" -lt 1000000 ]; do cat "$work/sst2.txt" >>"$lines"; done
  head -n 1000000 "$lines" >"$lines.tmp" && mv "$lines.tmp" "$lines"
fi
out="$work/1m.jsonl"
rm -f "$out" "$out.partial"
start=$(date +%s.%N)
/usr/bin/time -v "$bertha" embed --model "$model" --input "$lines" --output "$out" \
  2>"$work/time.txt" &
pid=$!
# The output's size at 2, 5, 10 and 30 s (it grows as it goes).
for t in 2 5 10 30; do
  while awk -v now="$(date +%s.%N)" -v s="$start" -v t="$t" 'BEGIN { exit !(now - s < t) }'; do sleep 0.1; done
  f="$out.partial"; [ -f "$f" ] || f="$out"
  echo "after ${t} s: $(wc -l <"$f" 2>/dev/null || echo 0) lines written"
done
wait "$pid"
end=$(date +%s.%N)
secs=$(awk -v a="$end" -v b="$start" 'BEGIN { printf "%.1f", a - b }')
echo "lines out: $(wc -l <"$out")"
echo "embed wall s: $secs, texts/s: $(awk -v s="$secs" 'BEGIN { printf "%.1f", 1000000 / s }')"
grep -E "Maximum resident set size|Elapsed" "$work/time.txt"
"$bertha" bench --model "$model" --input "$lines" --limit "$limit" --reps 1 --latency-texts 0 --peak-size 256
