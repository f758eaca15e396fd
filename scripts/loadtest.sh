#!/usr/bin/env bash
# Load test of `bertha serve` /embed on loopback with wrk (Debian package):
# throughput and latency at 1, 8, 64 and 256 concurrent connections, each
# request one SST-2 dev sentence (round robin); then 64 clients served while
# 1,000 idle connections are held open, and 8 clients served while 200
# slowloris connections trickle request heads (which the header-read
# timeout, 30 s by default, must cut off). Bounded: DURATION seconds per
# level, loopback only; the server is stopped at the end.
#
# Usage: scripts/loadtest.sh [SENTENCES_FILE] [DURATION_S]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sentences="${1:-$repo/../shared/data/sst2/dev.tsv}"
duration="${2:-15}"
port="${PORT:-18089}"

command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 1; }
cargo build --release -q -p bertha-cli --manifest-path "$repo/Cargo.toml"

work="$(mktemp -d)"
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# Request bodies: {"inputs": "<sentence>"} per line, JSON-escaped by python.
python3 - "$sentences" "$work/bodies.txt" <<'PY'
import json, sys
src, out = sys.argv[1], sys.argv[2]
lines = open(src, encoding="utf-8").read().splitlines()
if lines and lines[0].startswith("sentence\t"):
    lines = [l.split("\t")[0] for l in lines[1:]]
with open(out, "w") as f:
    for l in lines:
        if l.strip():
            f.write(json.dumps({"inputs": l}) + "\n")
PY

cat > "$work/post.lua" <<LUA
local bodies = {}
for line in io.lines("$work/bodies.txt") do bodies[#bodies + 1] = line end
local i = 0
request = function()
  i = i % #bodies + 1
  return wrk.format("POST", "/embed", {["Content-Type"] = "application/json"}, bodies[i])
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d errors=%d rps=%.1f p50_ms=%.2f p99_ms=%.2f\n",
    summary.requests, summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.requests / (summary.duration / 1e6), latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
LUA

"${CARGO_TARGET_DIR:-$repo/target}/release/bertha" serve --port "$port" --max-concurrent-requests 512 >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.2
done

level() { # CONNECTIONS LABEL
  local c=$1 label=$2 out r rps p50 p99 err
  out="$(wrk -t "$(( c < 2 ? 1 : 2 ))" -c "$c" -d "${duration}s" --timeout 30s -s "$work/post.lua" "http://127.0.0.1:$port" 2>&1)"
  r="$(echo "$out" | grep RESULT)"
  rps=$(echo "$r" | sed 's/.*rps=\([0-9.]*\).*/\1/')
  p50=$(echo "$r" | sed 's/.*p50_ms=\([0-9.]*\).*/\1/')
  p99=$(echo "$r" | sed 's/.*p99_ms=\([0-9.]*\).*/\1/')
  err=$(echo "$r" | sed 's/.*errors=\([0-9]*\).*/\1/')
  echo "| $label | $rps | $p50 | $p99 | $err |"
}

echo "| concurrent clients | requests/s | p50 ms | p99 ms | errors |"
echo "|---|---|---|---|---|"
for c in 1 8 64 256; do level "$c" "$c"; done
hold="$repo/scripts/hold_connections.py"
python3 "$hold" idle 1000 127.0.0.1 "$port" "$(( duration + 4 ))" >"$work/idle.txt" &
sleep 2
level 64 "64, with 1,000 idle connections held open"
wait $!
python3 "$hold" slowloris 200 127.0.0.1 "$port" 45 >"$work/slow.txt" &
sleep 2
level 8 "8, during 200 slowloris connections"
wait $!
cat "$work/idle.txt" "$work/slow.txt"
curl -s "http://127.0.0.1:$port/metrics" | grep -E "^bertha_batch_size_(sum|count)" | tr '\n' ' '; echo
echo "server peak RSS: $(grep VmHWM /proc/$server_pid/status | tr -s ' ')"
