#!/usr/bin/env bash
# The library's kernel tests and a parity subset, cross-built for aarch64
# and run under user-mode qemu (`-cpu max`: NEON, dotprod, i8mm, bf16), so
# the code every ARM user runs (our NEON fp32 tiles, `sdot` int8 and `bfdot`
# bf16 tiles, the scalar row loops, the gemm crate's NEON kernels on the
# candle path)
# is tested on every CI run.
# Correctness only: qemu says nothing about speed. Set up once with
# scripts/setup-arm.sh (Debian's rustc-web, whose aarch64 standard library
# rustup's toolchain lacks). Arguments go to cargo test (options, not test
# filters). Prints cargo's test summaries and exits non-zero on any failure.
#
# Sized to CI's time: ~10 min to build from clean, ~5 min to run. qemu
# emulates floating point in software, ~60× slower than the machine, so
# the two whole-model int8 and bf16 checks of minilm_parity (5+ min each
# there) are skipped: the int8 and bf16 products (`sdot`, `bfdot`) are
# checked in the library's tests against their definitions, and bf16
# training steps against fp32 in fast_training.
#
#
# The runner puts the cross C library (libc6-arm64-cross, which the build
# links against) on LD_LIBRARY_PATH. Without it qemu's `-L` prefix gives
# the cross package's dynamic loader, but the loader finds libc.so.6 through
# the host's ld.so.cache in /lib/aarch64-linux-gnu, where the multiarch
# libc6:arm64 (pulled in by libstd-rust-web-dev:arm64) is another glibc
# build: a loader and a libc of two builds disagree on their private state,
# and every test binary hung in pthread_create, walking a stack-cache list
# that was never initialised for that libc.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x /usr/bin/cargo ] && [ -d /usr/lib/rustlib/aarch64-unknown-linux-gnu ] || {
  echo "test-arm.sh: no aarch64 toolchain: run scripts/setup-arm.sh" >&2
  exit 1
}
scripts/fetch-model.sh
export RUSTC=/usr/bin/rustc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib -cpu max"
# Its own build folder: another compiler's artifacts, kept apart from the
# host's (and from CI's disk-hungry debug info: none here).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/aarch64-qemu"
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_INCREMENTAL=0
# Without `show` (plots and t-SNE: no kernels, and a third of the build).
/usr/bin/cargo test --locked --target aarch64-unknown-linux-gnu -p bertha \
  --no-default-features --no-fail-fast \
  --lib --test tiny_parity --test minilm_parity --test heads_parity --test ops_grad \
  --test fast_training "$@" \
  -- --skip int8_embeddings_stay_within --skip bf16_embeddings_stay_within
