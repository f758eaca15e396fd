#!/usr/bin/env bash
# A data-parallel run across two "hosts" on this one machine: two Linux
# network namespaces (h1 10.77.0.1, h2 10.77.0.2) joined by a veth pair, each
# process with its own hostname (UTS namespace), so MPI treats them as two
# machines and every byte between them crosses TCP (UCX_TLS=tcp,self), as on
# a real cluster. MPICH's Hydra starts the remote process through an
# rsh stand-in (`ip netns exec`), where a cluster would use ssh or Slurm.
# Needs root (CAP_NET_ADMIN) and an MPI build.
#
#   scripts/two-hosts.sh             # MLM pre-training, `mini`, 32 x 128: one process
#                                    # beside two hosts x 1 process, losses compared,
#                                    # tokens/s and the bytes the veth carried
#   STEPS=5 scripts/two-hosts.sh
#   scripts/two-hosts.sh down        # remove the namespaces
set -euo pipefail
cd "$(dirname "$0")/.."

down() {
  ip netns del h1 2>/dev/null || true
  ip netns del h2 2>/dev/null || true
}
if [ "${1:-}" = down ]; then
  down
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "two-hosts.sh: making network namespaces needs root (CAP_NET_ADMIN)" >&2
  exit 1
fi

DATA=${DATA:-../shared/data}
STEPS=${STEPS:-20}
OUT=.cache/bench/two-hosts
TARGET=${CARGO_TARGET_DIR:-target}
mkdir -p "$OUT"
scripts/setup-mpi.sh
cargo build --release --quiet -p bertha-cli --features mpi
BERTHA=$(realpath "$TARGET/release/bertha")
DATA=$(realpath "$DATA")

# The two hosts.
down
ip netns add h1
ip netns add h2
ip link add veth1 type veth peer name veth2
ip link set veth1 netns h1
ip link set veth2 netns h2
ip -n h1 addr add 10.77.0.1/24 dev veth1
ip -n h2 addr add 10.77.0.2/24 dev veth2
for ns in h1 h2; do ip -n $ns link set lo up; done
ip -n h1 link set veth1 up
ip -n h2 link set veth2 up
trap down EXIT

# Hydra's rsh launcher calls `RSH HOST COMMAND`: run COMMAND in that host's
# namespace under its own hostname.
RSH="$PWD/$OUT/netns-rsh"
cat > "$RSH" <<'EOF'
#!/bin/sh
host="$1"; shift
while [ "${1#-}" != "$1" ]; do shift; done
case "$host" in
  10.77.0.1) ns=h1 ;;
  10.77.0.2) ns=h2 ;;
  *) echo "netns-rsh: unknown host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c "hostname bertha-$ns; $*"
EOF
chmod +x "$RSH"

head -c 3000000 "$DATA/corpus/wiki_vital_en.txt" > "$OUT/corpus.txt"
ARGS=(pretrain --corpus "$PWD/$OUT/corpus.txt" --config mini --tokenizer "$DATA/vocab/bert-base-uncased"
  --steps $((STEPS + 3)) --batch-size 32 --seq-len 128 --lr 5e-4 --eval-size 0 --eval-every 1000000)
[ -d "$DATA/vocab/bert-base-uncased" ] || { echo "no vocabulary at $DATA/vocab" >&2; exit 1; }
rm -rf "$OUT/one" "$OUT/two"
echo "== one process, 1 thread"
RAYON_NUM_THREADS=1 "$BERTHA" "${ARGS[@]}" --out "$PWD/$OUT/one" 2>/dev/null
before=$(ip -n h2 -s link show veth2 | awk '/RX:/{getline; print $1}')
echo "== two hosts (namespaces h1, h2) x 1 process x 1 thread, TCP between them"
ip netns exec h1 env UCX_TLS=tcp,self RAYON_NUM_THREADS=1 \
  mpiexec -launcher rsh -launcher-exec "$RSH" -hosts 10.77.0.1,10.77.0.2 -n 2 \
  "$BERTHA" "${ARGS[@]}" --out "$PWD/$OUT/two" 2>&1 | grep -v '^\s*$' | head -3
after=$(ip -n h2 -s link show veth2 | awk '/RX:/{getline; print $1}')
python3 - "$OUT" "$before" "$after" <<'PY'
import json, statistics, sys
out, before, after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rows(d):
    return [json.loads(l) for l in open(f"{out}/{d}/metrics.jsonl") if '"tokens_per_s"' in l]
one, two = rows("one"), rows("two")
tps = lambda r: statistics.median(x["tokens_per_s"] for x in r[3:])
same = max(abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(one, two))
print(f"1 process x 1 thread: {tps(one):.0f} tokens/s")
print(f"2 hosts x 1 process:  {tps(two):.0f} tokens/s ({tps(two) / tps(one):.2f}x); "
      f"per-step losses equal to {same:.1e} relative; "
      f"h2 received {(after - before) / 1e6:.1f} MB over the veth in {len(two)} steps")
PY
