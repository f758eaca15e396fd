#!/usr/bin/env bash
# Real, unmodified clients against `bertha serve` (issue 18's drop-in check):
#   - the OpenAI Python client: embeddings.create, float and base64;
#   - huggingface_hub's InferenceClient(model=URL): feature_extraction on an
#     embedding server, text_classification on a classifier, and
#     sentence_similarity on a server started with --task sentence-similarity
#     (TEI's TASK=sentence-similarity);
#   - grpcio, with stubs that grpcio-tools compiles at run time from the
#     vendored crates/bertha-server/proto/tei.proto, against the gRPC port
#     (--grpc-port) of the embedding and classifier servers: Info, Embed,
#     EmbedStream, Tokenize, Decode, Predict, PredictStream, Rerank;
# each answer compared with the bertha command's own output on the same texts
# (scripts/real_clients.py). bertha is built with `--features grpc`, in the
# release profile unless CARGO_PROFILE says otherwise (`dev`: the test
# build's optimised dependencies, much quicker to build; the answers are the
# same). Needs PyPI for the clients (a venv in $CLIENTENV, default
# ~/.clientenv). Prints one line per check; exits non-zero on the first
# mismatch.
#
#   scripts/real-clients.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ENV=${CLIENTENV:-$HOME/.clientenv}
MODEL=${MODEL:-.cache/models/all-MiniLM-L6-v2}
CLASSIFIER=tests/fixtures/tiny/bert-seqcls
PORT=${PORT:-18101}

[ -x "$ENV/bin/python" ] || python3 -m venv "$ENV"
"$ENV/bin/pip" install -q openai huggingface_hub numpy grpcio grpcio-tools
[ -d "$MODEL" ] || scripts/fetch-model.sh
PROFILE=${CARGO_PROFILE:-release}
cargo build --profile "$PROFILE" -q -p bertha-cli --features grpc
BERTHA="${CARGO_TARGET_DIR:-target}/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")/bertha"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
serve() { # PORT ARGS...
  local port=$1; shift
  "$BERTHA" serve --port "$port" "$@" >"/tmp/bertha-client-$port.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 150); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && return
    sleep 0.2
  done
  echo "server on $port did not start:" >&2; cat "/tmp/bertha-client-$port.log" >&2; exit 1
}
serve "$PORT" --model "$MODEL" --served-model-name minilm --grpc-port $((PORT + 10))
serve $((PORT + 1)) --model "$CLASSIFIER" --grpc-port $((PORT + 11))
serve $((PORT + 2)) --model "$MODEL" --task sentence-similarity

"$ENV/bin/python" scripts/real_clients.py --bertha "$BERTHA" --model "$MODEL" --classifier "$CLASSIFIER" \
  --embed-url "http://127.0.0.1:$PORT" --classify-url "http://127.0.0.1:$((PORT + 1))" \
  --similarity-url "http://127.0.0.1:$((PORT + 2))" \
  --proto crates/bertha-server/proto/tei.proto \
  --grpc-embed "127.0.0.1:$((PORT + 10))" --grpc-classify "127.0.0.1:$((PORT + 11))"
