#!/usr/bin/env bash
# Data-parallel training figures on this machine (an MPI build; MPICH from
# scripts/setup-mpi.sh), for the README:
#
#   1. all-reduce bandwidth: bertha's bucketed gradient reduction
#      (crates/bertha/examples/allreduce_bench.rs) beside MPI_Allreduce itself
#      (scripts/mpi/allreduce_bench.c, timed as OSU's osu_allreduce), same sizes;
#   2. MLM pre-training tokens/s, `mini` preset, 32 x 128: 1 process x 2 threads
#      against 2 processes x 1 thread (mpiexec), and 2 processes' share of a step
#      spent in the gradient all-reduce;
#   3. a projection table (model, global batch, hosts, link -> step time and
#      efficiency) from the measured compute rate and the ring all-reduce's
#      traffic, its assumptions printed with it.
#
#   scripts/bench-dp.sh                   # everything (~10 min on 2 cores)
#   STEPS=10 scripts/bench-dp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-mpi.sh

DATA=${DATA:-../shared/data}
STEPS=${STEPS:-20}
NP=${NP:-2}
OUT=.cache/bench/dp
TARGET=${CARGO_TARGET_DIR:-target}
mkdir -p "$OUT"
cargo build --release --quiet -p bertha-cli --features mpi
cargo build --release --quiet -p bertha --features mpi --example allreduce_bench
mpicc -O2 scripts/mpi/allreduce_bench.c -o "$OUT/mpi_allreduce_bench"
BERTHA="$TARGET/release/bertha"

echo "== all-reduce, $NP processes on this host (fp32 sums)"
mpiexec -np "$NP" "$OUT/mpi_allreduce_bench" | tee "$OUT/mpi-allreduce.tsv"
mpiexec -np "$NP" env RAYON_NUM_THREADS=1 "$TARGET/release/examples/allreduce_bench" 4 \
  | tee "$OUT/bertha-allreduce.tsv"
mpiexec -np "$NP" env RAYON_NUM_THREADS=1 "$TARGET/release/examples/allreduce_bench" 4 bf16 \
  | tee "$OUT/bertha-allreduce-bf16.tsv"

echo "== MLM pre-training, mini (L4 H256), 32 x 128, $STEPS steps after 3 warm-up"
head -c 3000000 "$DATA/corpus/wiki_vital_en.txt" > "$OUT/corpus.txt"
ARGS=(pretrain --corpus "$OUT/corpus.txt" --config mini --tokenizer "$DATA/vocab/bert-base-uncased"
  --steps $((STEPS + 3)) --batch-size 32 --seq-len 128 --lr 5e-4 --eval-size 0 --eval-every 1000000)
rm -rf "$OUT/np1" "$OUT/np$NP"
RAYON_NUM_THREADS=$NP "$BERTHA" "${ARGS[@]}" --out "$OUT/np1" 2>/dev/null
mpiexec -np "$NP" env RAYON_NUM_THREADS=1 "$BERTHA" "${ARGS[@]}" --out "$OUT/np$NP" 2>/dev/null
python3 - "$OUT" "$NP" <<'PY'
import json, statistics, sys
out, np_ = sys.argv[1], int(sys.argv[2])
def tps(d):
    rows = [json.loads(l) for l in open(f"{out}/{d}/metrics.jsonl") if '"tokens_per_s"' in l]
    return statistics.median(r["tokens_per_s"] for r in rows[3:]), rows
one, r1 = tps("np1")
many, rn = tps(f"np{np_}")
same = max(abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(r1, rn))
print(f"1 process x {np_} threads: {one:.0f} tokens/s")
print(f"{np_} processes x 1 thread: {many:.0f} tokens/s ({many / one:.2f}x); "
      f"per-step losses equal to {same:.1e} relative")
json.dump({"np1": one, "npN": many, "np": np_}, open(f"{out}/train.json", "w"))
PY

echo "== projection"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
train = json.load(open(f"{out}/train.json"))
rows = [l.split() for l in open(f"{out}/bertha-allreduce.tsv") if not l.startswith("#")]
loopback = float(max(rows, key=lambda r: int(r[0]))[2])
# (encoder parameters, word-embedding parameters) with a 30,522-token vocabulary.
models = {"mini": (3.2e6, 30522 * 256), "base": (85.5e6, 30522 * 768), "large": (302e6, 30522 * 1024)}
def flops_per_token(m):
    enc, emb = models[m]
    return 6 * (enc + 0.15 * emb)  # forward + backward; the decoder on the 15 % masked rows only
rate = train["np1"] * flops_per_token("mini")
print(f"assumed: hosts like this one, each computing {rate / 1e9:.1f} GFLOP/s (measured: mini, 1 process x"
      f" 2 threads, {train['np1']:.0f} tokens/s, at 6 x (encoder + 15 % of the embedding) parameters per"
      f" token; attention scores left out); fp32 gradients of every parameter; a ring all-reduce"
      f" moving 2(N-1)/N x the gradient bytes per host at 80 % of the link, not overlapped with the"
      f" backward (candle hands over gradients at its end). Loopback here: {loopback:.2f} GB/s.")
print("| model | parameters | global batch | hosts | link | compute s | all-reduce s | step s | efficiency |")
print("|---|---|---|---|---|---|---|---|---|")
tokens = 256 * 128
for name, (enc, emb) in models.items():
    for link, gbit in [("10 GbE", 10), ("100 Gb/s", 100)]:
        for hosts in [1, 8, 64]:
            compute = flops_per_token(name) * tokens / hosts / rate
            grad_bytes = 4 * (enc + emb)
            comm = 0.0 if hosts == 1 else 2 * (hosts - 1) / hosts * grad_bytes / (gbit / 8 * 1e9 * 0.8)
            step = compute + comm
            print(f"| {name} | {(enc + emb) / 1e6:.0f} M | 256 x 128 | {hosts} | {link} | {compute:.2f} |"
                  f" {comm:.3f} | {step:.2f} | {compute / step * 100:.0f} % |")
PY
