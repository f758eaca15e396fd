#!/usr/bin/env bash
# Sentence embeddings of the BERT families other than BERT, side by side in
# one session: bertha (`bertha bench`, f32 and int8 on the packed fast path)
# against sentence-transformers and ONNX Runtime fp32 / dynamic int8 at their
# best practice (scripts/anchor_family_embed.py), on random-weight models of
# the real models' shapes made by transformers (distilroberta, distilbert,
# albert-base, electra-small; see the anchor's usage), SST-2 dev (872
# sentences), batch 32, mean pooling, truncation 256.
#
#   scripts/bench-family-embed.sh
#   SHAPES=albert-base REPEATS=3 scripts/bench-family-embed.sh
#
# REPEATS=N alternates bertha's runs and the anchors' N times per model; the
# table gives medians, their ratio and each round's. Needs a release build
# (made here) and the Python environment of ../shared/bench/README.md in
# ~/.refenv (REFENV=... overrides).
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data}
REFENV=${REFENV:-$HOME/.refenv}
SHAPES=${SHAPES:-distilroberta distilbert albert-base electra-small}
REPS=${REPS:-3}
REPEATS=${REPEATS:-1}
ANCHOR=scripts/anchor_family_embed.py
PY=$REFENV/bin/python
OUT=.cache/bench/family-embed
mkdir -p "$OUT"
[ -x "$PY" ] || { echo "no Python environment in $REFENV: see ../shared/bench/README.md" >&2; exit 1; }
cargo build --release -p bertha-cli --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/bertha

python3 - "$DATA/sst2/dev.tsv" "$OUT/sst2-dev.txt" <<'EOF'
import csv, sys
with open(sys.argv[1], encoding="utf-8") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
open(sys.argv[2], "w", encoding="utf-8").write("\n".join(r["sentence"].strip() for r in rows) + "\n")
EOF

rm -f "$OUT"/*.json "$OUT"/*.txt.out
vocab=$DATA/vocab/bert-base-uncased/vocab.txt
for shape in $SHAPES; do
    dir=$OUT/$shape
    # A folder made before the anchors checked their tokenizer holds 5 tokens: remade.
    python3 scripts/anchor_vocab.py matches "$dir" "$vocab" || { rm -rf "$dir"; "$PY" "$ANCHOR" make "$shape" "$vocab" "$dir"; }
    for round in $(seq "$REPEATS"); do
        for p in f32 int8; do
            echo "== $shape, round $round: bertha --precision $p"
            "$BIN" bench --model "$dir" --input "$OUT/sst2-dev.txt" --batch-size 32 --reps "$REPS" \
                --latency-texts 0 --pooling mean --max-length 256 --precision "$p" 2>/dev/null \
                | tee "$OUT/$shape-r$round-$p.json"
        done
        echo "== $shape, round $round: anchors"
        "$PY" "$ANCHOR" run "$dir" "$OUT/sst2-dev.txt" 32 "$REPS" st,ort,ort_int8 2>"$OUT/$shape-r$round.err" \
            | tee "$OUT/$shape-r$round.txt.out" \
            || echo "anchor failed on $shape: $(tail -1 "$OUT/$shape-r$round.err")" >&2
    done
done

python3 - "$OUT" "$REPEATS" $SHAPES <<'EOF'
import json, os, re, statistics, sys
out, repeats, shapes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def anchors(shape, r):
    """{mode: (texts/s, min cosine or None)} of one anchor run."""
    got, path = {}, f"{out}/{shape}-r{r}.txt.out"
    for line in open(path) if os.path.exists(path) else []:
        m = re.search(r"([\d.]+) texts/s(?:, min cosine to fp32 ([\d.]+))?", line)
        mode = "st" if line.startswith("sentence-transformers") else "ort_int8" if "int8" in line else "ort"
        if m:
            got[mode] = (float(m.group(1)), m.group(2) and float(m.group(2)))
    return got
def ours(shape, r, p):
    try:
        j = json.load(open(f"{out}/{shape}-r{r}-{p}.json"))
        return j["texts_per_s"], j.get("min_cosine_to_f32"), j.get("fast_path")
    except (FileNotFoundError, json.JSONDecodeError):
        return None
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
fmt = lambda x: "–" if x is None else f"{x:.1f}"
ratio = lambda a, b: "–" if a is None or b is None else f"{a / b:.2f}×"
cos = lambda cs: "" if not [c for c in cs if c is not None] else f" ({min(c for c in cs if c is not None):.5f})"
print(f"\nSST-2 dev, batch 32, mean pooling: texts/s, median of {repeats} round(s) (min cosine to fp32)")
print("| model | bertha f32 | sentence-transformers | ONNX Runtime fp32 | bertha ÷ ORT fp32 | bertha int8 | ORT int8 | bertha int8 ÷ ORT int8 | each round: f32, int8 ratios |")
print("|---|---|---|---|---|---|---|---|---|")
for s in shapes:
    rs = range(1, repeats + 1)
    f32 = [ours(s, r, "f32") or (None, None, None) for r in rs]
    i8 = [ours(s, r, "int8") or (None, None, None) for r in rs]
    an = [anchors(s, r) for r in rs]
    st = [a.get("st", (None,))[0] for a in an]
    o32 = [a.get("ort", (None,))[0] for a in an]
    o8 = [a.get("ort_int8", (None, None)) for a in an]
    f32m, i8m, o32m, o8m = med([x[0] for x in f32]), med([x[0] for x in i8]), med(o32), med([x[0] for x in o8])
    rounds = "; ".join(f"{ratio(a[0], b)}, {ratio(c[0], d[0])}" for a, b, c, d in zip(f32, o32, i8, o8))
    if not all(x[2] for x in f32 + i8 if x[0] is not None):
        s += " (not on the fast path)"
    print(f"| {s} | {fmt(f32m)} | {fmt(med(st))} | {fmt(o32m)} | {ratio(f32m, o32m)} | {fmt(i8m)}{cos([x[1] for x in i8])} "
          f"| {fmt(o8m)}{cos([x[1] for x in o8])} | {ratio(i8m, o8m)} | {rounds} |")
EOF
