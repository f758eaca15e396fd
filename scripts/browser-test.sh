#!/usr/bin/env bash
# Test the web playground (`bertha serve`'s page at /) in a real headless Chromium.
#
# Installs Debian's `chromium` with apt-get when no Chromium is found, and
# puppeteer-core from npm (it downloads no browser) into the git-ignored
# .cache/browser-test. Builds target/debug/bertha when it is missing or older
# than the sources (dev profile), then starts two servers on free loopback
# ports: one with an MLM head (default: the tiny tests/fixtures/tiny/bert-mlm)
# for fill-mask, one with the default model (all-MiniLM-L6-v2, headless) for
# the attention explorer and the "missing head" error. scripts/browser-test.mjs
# drives the page; it prints PASS / FAIL lines and saves screenshots.
#
# Usage: scripts/browser-test.sh [--out DIR] [--model DIR] [--mlm-model DIR]
#   --out        where the screenshots go (default: docs/, i.e. docs/playground-fill-mask.png
#                and docs/playground-attention.png are overwritten)
#   --model      model for the attention explorer (default: $BERTHA_MODEL, else
#                .cache/models/all-MiniLM-L6-v2, fetched by scripts/fetch-model.sh when missing)
#   --mlm-model  model with an MLM head for fill-mask (default: tests/fixtures/tiny/bert-mlm)
# Environment: CHROMIUM (browser binary), BERTHA_BIN (prebuilt bertha binary).
#
# CI (.ci/run) runs it after the test suite, with --out a temporary folder
# and BERTHA_BIN the test build's binary. It needs apt (root or sudo) for chromium.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

out="$repo/docs"
model="${BERTHA_MODEL:-$repo/.cache/models/all-MiniLM-L6-v2}"
mlm_model="$repo/tests/fixtures/tiny/bert-mlm"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --mlm-model) mlm_model="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"

log() { echo "browser-test: $*" >&2; }

# --- Chromium -----------------------------------------------------------------
find_chromium() {
  local c
  for c in "${CHROMIUM:-}" chromium chromium-browser google-chrome-stable google-chrome; do
    [[ -n "$c" ]] && command -v "$c" >/dev/null 2>&1 && { command -v "$c"; return 0; }
  done
  return 1
}
if ! chromium="$(find_chromium)"; then
  log "no Chromium found; installing Debian's chromium with apt-get"
  sudo=()
  if [[ "$(id -u)" -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "error: not root and no sudo to install chromium" >&2; exit 1; }
    sudo=(sudo -n)
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! "${sudo[@]}" apt-get install -y --no-install-recommends chromium >&2; then
    "${sudo[@]}" apt-get update >&2
    "${sudo[@]}" apt-get install -y --no-install-recommends chromium >&2
  fi
  chromium="$(find_chromium)" || { echo "error: chromium still not found after apt-get" >&2; exit 1; }
fi
log "browser: $chromium ($("$chromium" --version 2>/dev/null || echo '?'))"

# --- puppeteer-core -------------------------------------------------------------
command -v node >/dev/null && command -v npm >/dev/null \
  || { echo "error: node and npm are needed (apt-get install nodejs npm)" >&2; exit 1; }
deps="$repo/.cache/browser-test"
if [[ ! -f "$deps/node_modules/puppeteer-core/package.json" ]]; then
  log "installing puppeteer-core into $deps"
  mkdir -p "$deps"
  [[ -f "$deps/package.json" ]] || echo '{"name": "bertha-browser-test", "private": true}' > "$deps/package.json"
  PUPPETEER_SKIP_DOWNLOAD=1 npm install --prefix "$deps" --no-audit --no-fund --loglevel=error \
    puppeteer-core@24 >&2
fi

# --- bertha binary ----------------------------------------------------------------
bin="${BERTHA_BIN:-$repo/target/debug/bertha}"
if [[ -z "${BERTHA_BIN:-}" ]]; then
  # The page is compiled in (include_str!), so any newer source means a rebuild.
  if [[ ! -x "$bin" ]] || [[ -n "$(find crates Cargo.toml Cargo.lock -newer "$bin" -type f -print -quit 2>/dev/null)" ]]; then
    log "building bertha (cargo build -p bertha-cli, dev profile)"
    cargo build -p bertha-cli >&2
  fi
fi
[[ -x "$bin" ]] || { echo "error: no bertha binary at $bin" >&2; exit 1; }

# --- models -------------------------------------------------------------------------
if [[ ! -f "$model/config.json" ]]; then
  if [[ "$model" == "$repo/.cache/models/all-MiniLM-L6-v2" ]]; then
    "$repo/scripts/fetch-model.sh" "$model"
  else
    echo "error: no model at $model" >&2; exit 1
  fi
fi
[[ -f "$mlm_model/config.json" ]] || { echo "error: no MLM model at $mlm_model" >&2; exit 1; }

# --- servers ------------------------------------------------------------------------
work="$(mktemp -d)"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  node -e 'const s = require("net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });'
}

# start_server NAME MODEL: sets $url
start_server() {
  local name="$1" dir="$2" port pid i
  port="$(free_port)"
  "$bin" serve --model "$dir" --host 127.0.0.1 --port "$port" --threads 2 >"$work/$name.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  url="http://127.0.0.1:$port"
  for ((i = 0; i < 240; i++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "error: bertha serve ($name) exited:" >&2; cat "$work/$name.log" >&2; exit 1
    fi
    if curl -fsS -o /dev/null "$url/health" 2>/dev/null; then
      log "$name server: $url (model $dir)"
      return 0
    fi
    sleep 0.5
  done
  echo "error: bertha serve ($name) not healthy after 120 s:" >&2; cat "$work/$name.log" >&2; exit 1
}
start_server mlm "$mlm_model"; mlm_url="$url"
start_server main "$model"; main_url="$url"

# --- the test -------------------------------------------------------------------------
# In the background + wait, so that INT / TERM reach the trap at once (puppeteer closes
# the browser on TERM).
status=0
BROWSER_TEST_MODULES="$deps/node_modules" node "$repo/scripts/browser-test.mjs" \
  --chromium "$chromium" --mlm-url "$mlm_url" --url "$main_url" --out "$out" &
pids+=("$!")
wait "$!" || status=$?
if [[ $status -ne 0 ]]; then
  for f in "$work"/*.log; do echo "--- $(basename "$f")" >&2; tail -n 20 "$f" >&2; done
fi
exit "$status"
