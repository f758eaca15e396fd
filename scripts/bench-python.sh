#!/usr/bin/env bash
# Side by side, in one run, on SST-2 dev (872 sentences, batch 32,
# all-MiniLM-L6-v2): `bertha bench` (the CLI), bertha.SentenceTransformer.encode
# (the release wheel) and sentence-transformers' encode (torch on 2 threads).
# Prints each one's texts/s and the ratios: the binding should add no real
# cost over the CLI, and bertha should be well ahead of sentence-transformers.
#
# Usage: scripts/bench-python.sh [ROUNDS]   (default 1; each round runs all three)
# REFENV: a venv with sentence-transformers and torch (default ~/.refenv);
# without it that column is skipped. Not part of CI (a benchmark, not a test).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rounds=${1:-1}
scripts/fetch-model.sh
model=${BERTHA_MODEL:-$PWD/.cache/models/all-MiniLM-L6-v2}
data=${SST2_DEV:-$PWD/../shared/data/sst2/dev.tsv}
refenv=${REFENV:-$HOME/.refenv}
venv=${BERTHA_PY_BENCH_VENV:-target/py-venv-release}

cargo build --release --locked -p bertha-cli
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
MATURIN_PEP517_USE_BASE_PYTHON=1 MATURIN_PEP517_ARGS="--locked" "$venv/bin/python" -m pip install -q \
  --disable-pip-version-check --force-reinstall ./python

lscpu | grep -E '^Model name' || true
echo "flags: $(grep -ow -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
rate() { python3 -c 'import json,sys; print("%.1f" % json.loads(sys.stdin.read().strip().splitlines()[-1])["texts_per_s"])'; }
for r in $(seq "$rounds"); do
  cli=$(target/release/bertha bench -m "$model" -i "$data" --column sentence --batch-size 32 \
    --reps 3 --latency-texts 0 --peak-size 256 2>/dev/null | rate)
  py=$("$venv/bin/python" python/benchmarks/encode_speed.py bertha --model "$model" --input "$data" | rate)
  if [ -x "$refenv/bin/python" ]; then
    st=$("$refenv/bin/python" python/benchmarks/encode_speed.py st --model "$model" --input "$data" --threads 2 2>/dev/null | rate)
  else
    st=nan
  fi
  python3 - "$r" "$cli" "$py" "$st" <<'PY'
import sys
r, cli, py, st = sys.argv[1], *map(float, sys.argv[2:])
print(f"round {r}: texts/s  bertha bench {cli:.1f} | bertha.SentenceTransformer.encode {py:.1f} | "
      f"sentence-transformers {st:.1f}")
print(f"  python / cli = {py / cli:.3f} ({(py / cli - 1) * 100:+.1f} %); python / sentence-transformers = {py / st:.2f}x")
PY
done
