#!/usr/bin/env bash
# The Python package's tests (python/tests): installs the package from the
# checkout into a venv, `pip install ./python pytest` (numpy comes as its
# dependency), and runs pytest. Arguments go to pytest, e.g. `-k encode`.
#
# The wheel is built with cargo's `dev` profile (MATURIN_PEP517_ARGS):
# dependencies at opt-level 3 as the Rust tests build them, in the same
# target/, so after scripts/test.sh only the bindings and the library are
# compiled, not the whole tree again in release. BERTHA_PY_PROFILE=release
# builds the release wheel instead, as a plain `pip install ./python` does.
#
# The venv is target/py-venv (BERTHA_PY_VENV to change); pip needs PyPI
# for maturin, numpy and pytest. The test model is fetched as for the Rust
# tests (scripts/fetch-model.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/fetch-model.sh
venv=${BERTHA_PY_VENV:-target/py-venv}
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
profile=${BERTHA_PY_PROFILE:-dev}
export MATURIN_PEP517_ARGS="--profile $profile --locked"
# The base interpreter, not the venv's: PyO3's build config then stays the
# same across venvs, and cargo does not rebuild the bindings for each.
export MATURIN_PEP517_USE_BASE_PYTHON=1
# pytest and numpy (the package's one dependency), then the package alone
# with --force-reinstall: its version does not change between builds, and
# pip would otherwise keep the old wheel. One wheel build either way.
"$venv/bin/python" -m pip install -q --disable-pip-version-check pytest numpy
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps ./python
"$venv/bin/python" -m pytest python/tests -q "$@"
