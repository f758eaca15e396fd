#!/usr/bin/env bash
# Replays issue 46's hostile cases end to end against a bertha binary and
# prints one line per case (HELD / NOT HELD) and the counts.
#
# Usage: scripts/probe.sh [BERTHA]   (default: target/release/bertha; build
# it with `cargo build --release -p bertha-cli`). Needs curl and python3;
# the model is tests/fixtures' tiny checkpoints and, for embed and the
# quantised folder, all-MiniLM-L6-v2 (scripts/fetch-model.sh).
# No pipefail: a refusal is a failing bertha, and the checks read its output.
set -u
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$repo/target/release/bertha}"
[[ -x "$bin" ]] || { echo "no binary at $bin" >&2; exit 2; }
tiny="$repo/tests/fixtures/tiny"
minilm="${BERTHA_MODEL:-$repo/.cache/models/all-MiniLM-L6-v2}"
corpus="$repo/tests/fixtures/corpus-wiki-slice.txt"
tok="$repo/tests/fixtures/minilm-tokenizer"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
held=0 not=0
verdict() { # case, description, condition exit status
  if [[ $3 -eq 0 ]]; then echo "HELD      $1: $2"; held=$((held + 1))
  else echo "NOT HELD  $1: $2"; not=$((not + 1)); fi
}

# 1. --overwrite on a folder that is not a prepared corpus (the corpus itself).
mkdir -p "$work/cdir" && cp "$corpus" "$work/cdir/text.txt"
"$bin" prepare-corpus --corpus "$work/cdir" --out "$work/cdir" --tokenizer "$tok" --overwrite 2>/dev/null
[[ -f "$work/cdir/text.txt" ]]; verdict 1 "prepare-corpus --out CORPUS --overwrite keeps the corpus" $?

# 12. --out EXISTING_FILE --overwrite: refused at once, no temporary left;
# a dead run's temporary folder is removed by the next run.
echo data >"$work/file"
"$bin" prepare-corpus --corpus "$corpus" --out "$work/file" --tokenizer "$tok" --overwrite 2>/dev/null
ok=$?; [[ $ok -ne 0 && "$(cat "$work/file")" == data && -z "$(ls -A "$work" | grep tmp)" ]]
r1=$?
mkdir -p "$work/.c.tmp-4194301" && echo x >"$work/.c.tmp-4194301/shard-00000.bin"
"$bin" prepare-corpus --corpus "$corpus" --out "$work/c" --tokenizer "$tok" >/dev/null 2>&1
[[ $r1 -eq 0 && ! -e "$work/.c.tmp-4194301" ]]; verdict 12 "no half-written prepare-corpus output" $?

# 14c. A shard named outside its folder, a changed token.
sed -i 's/shard-00000.bin/..\/x/' "$work/c/corpus.json"
out="$("$bin" pretrain --corpus "$work/c" --tokenizer "$tok" --out "$work/p" 2>&1)"
grep -q "not a shard-NNNNN.bin" <<<"$out"
verdict 14c "corpus.json naming ../x is refused" $?

# 11. A long single line: bounded memory (peak RSS, KB).
python3 -c "import sys; sys.stdout.write('word ' * 2_000_000)" >"$work/long.txt"
if command -v /usr/bin/time >/dev/null; then
  /usr/bin/time -f %M -o "$work/rss" "$bin" prepare-corpus --corpus "$work/long.txt" --out "$work/long" --tokenizer "$tok" >/dev/null 2>&1
  rss=$(cat "$work/rss"); [[ $rss -lt 1000000 ]]; verdict 11 "10 MB line peaks at ${rss} KB (< 1 GB)" $?
else echo "SKIPPED   11: no /usr/bin/time"; fi

# 2, 7. embed --resume-output.
printf 'one\ntwo\n' >"$work/in.txt"
for i in 1 2 3; do echo '{"embedding":[0.1]}'; done >"$work/out.jsonl"
"$bin" embed --model "$tiny/bert-mlm" --input "$work/in.txt" --output "$work/out.jsonl" --resume-output 2>/dev/null
[[ -f "$work/out.jsonl" && ! -e "$work/out.jsonl.partial" ]]; verdict 2 "a refused resume leaves OUT where it was" $?
echo '{"foo":1}' >"$work/o2.jsonl.partial"
"$bin" embed --model "$tiny/bert-mlm" --input "$work/in.txt" --output "$work/o2.jsonl" --resume-output 2>/dev/null
[[ $? -ne 0 ]]; verdict 7 "a kept line of another kind is refused" $?

# 8. finetune --task embedding --skip-bad-rows.
printf 'anchor\tpositive\na\tb\nbad\nc\td\ne\tf\n' >"$work/pairs.tsv"
"$bin" finetune --task embedding --model "$repo/tests/fixtures/st-embedding" --train "$work/pairs.tsv" \
  --out "$work/ft" --batch-size 2 --epochs 1 --skip-bad-rows >/dev/null 2>&1
verdict 8 "embedding --skip-bad-rows skips the bad row" $?

# 5. ner on a sequence classifier.
out="$("$bin" ner --model "$tiny/bert-seqcls" "the cat sat" 2>&1)"
grep -q "no BertForTokenClassification head" <<<"$out"
verdict 5 "ner on a sequence classifier names the missing head" $?

# 6. A quantised folder with a flipped byte.
if [[ -f "$minilm/config.json" ]]; then
  "$bin" quantize --model "$minilm" --out "$work/q" --precision int8 >/dev/null 2>&1
  python3 - "$work/q/bertha-packed.safetensors" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 1; open(p, 'wb').write(b)
PY
  "$bin" embed --model "$work/q" --precision int8 "hi" >/dev/null 2>&1
  [[ $? -ne 0 ]]; verdict 6 "a flipped byte in bertha-packed.safetensors is refused" $?
else echo "SKIPPED   6: no all-MiniLM-L6-v2 (scripts/fetch-model.sh)"; fi

# 3. Overlapping model names: an error at start, no panic.
timeout 60 "$bin" serve --model "a=$tiny/bert-mlm" --model "a/embed=$tiny/bert-mlm" --port 0 >"$work/s3" 2>&1
rc=$?; [[ $rc -eq 1 ]] && ! grep -q "serving on\|panicked" "$work/s3"; verdict 3 "overlapping model names refused at start (exit $rc)" $?

# The server cases: one server of a classifier and a headless model.
"$bin" serve --model "cls=$tiny/bert-seqcls" --model "qa=$tiny/bert-qa" --port 0 --max-qa-windows 50 2>"$work/serve.log" &
for _ in $(seq 100); do grep -q "serving on" "$work/serve.log" && break; sleep 0.2; done
base="$(head -1 "$work/serve.log" | grep -o 'http://[0-9.:]*')"
post() { curl -s -o "$work/body" -w '%{http_code}' -H 'content-type: application/json' -d "$2" "$base$1"; }
long="$(python3 -c "print('the cat sat ' * 400)")"
[[ "$(post /predict "{\"inputs\": \"$long\", \"truncate\": false}")" == 413 ]]
verdict 4 "/predict with truncate false and a long input is a 413" $?
[[ "$(post /ner '{"inputs": "the cat"}')" == 400 ]] && ! grep -q '/' "$work/body"
verdict 13 "a missing head is a 400 without the server's paths" $?
ids="[$(python3 -c "print(','.join(['[5,6]'] * 1000))")]"
[[ "$(post /decode "{\"ids\": $ids}")" == 422 ]]; verdict 9 "/decode of 1,000 lists is refused (batch limit)" $?
ctx="$(python3 -c "print('the cat sat on the mat. ' * 2000)")"
[[ "$(post /models/qa/qa "{\"question\": \"where\", \"context\": \"$ctx\", \"doc_stride\": 1}")" == 422 ]]
verdict 10 "/qa past --max-qa-windows is refused" $?
[[ "$(post /models/cls/ '{"inputs": "hi"}')" == 200 ]]; verdict 14a "POST /models/NAME/ routes" $?
name="$(python3 -c "print('m' * 100000)")"
post /v1/embeddings "{\"input\": \"hi\", \"model\": \"$name\"}" >/dev/null
[[ $(wc -c <"$work/body") -lt 500 ]]; verdict 14b "an unknown 100 KB model name is not echoed" $?
out="$(timeout 60 "$bin" serve --model "$tiny/bert-mlm" --port 0 --api-key "" 2>&1)"
grep -q "api-key is empty" <<<"$out" && ! grep -q "loading the model" <<<"$out"
verdict 14d "--api-key errors are not the model's" $?

echo "held: $held, not held: $not"
[[ $not -eq 0 ]]
