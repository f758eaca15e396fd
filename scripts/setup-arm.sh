#!/usr/bin/env bash
# Installs what scripts/test-arm.sh needs to cross-build bertha for aarch64
# and run its tests under qemu, from Debian's packages: rustc-web /
# cargo-web (Rust 1.96, with an aarch64 standard library in
# libstd-rust-web-dev:arm64, which rustup's toolchain here has not), the
# aarch64 cross linker and C library, and user-mode qemu.
set -euo pipefail
if [ -x /usr/bin/cargo ] && [ -d /usr/lib/rustlib/aarch64-unknown-linux-gnu ] \
  && command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO dpkg --add-architecture arm64
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq rustc-web cargo-web libstd-rust-web-dev:arm64 \
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null
/usr/bin/rustc --version
