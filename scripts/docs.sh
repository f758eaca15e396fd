#!/usr/bin/env bash
# Build the documentation (the mdBook in docs/, into target/book) and check
# its links offline (scripts/check-links.py: every internal link and #anchor
# of the built HTML resolves, the README's relative links name files, external
# links are well-formed). Installs the pinned mdbook with cargo when it is
# missing or another version (~4 min of compiling on 2 cores, once).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MDBOOK_VERSION=0.5.4
if ! command -v mdbook >/dev/null 2>&1 || [[ "$(mdbook --version)" != "mdbook v$MDBOOK_VERSION" ]]; then
  # No watch / serve: CI builds only (no tokio / axum / notify to compile).
  cargo install mdbook --locked --version "$MDBOOK_VERSION" --no-default-features --features search
fi
rm -rf target/book
mdbook build docs
python3 scripts/check-links.py target/book README.md docs/*.md docs/benchmarks/*.md
