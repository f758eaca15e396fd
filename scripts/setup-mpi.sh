#!/usr/bin/env bash
# Installs what `--features mpi` builds and runs against: Debian's MPICH
# (mpiexec, libmpich-dev) and libclang (rsmpi's bindings are generated with
# bindgen). MPICH, not OpenMPI: it runs as root and oversubscribes cores
# without extra flags (containers, CI), and its ABI is the one Intel MPI,
# Cray MPICH and MVAPICH share, so a binary built here runs on their clusters.
set -euo pipefail
if command -v mpicc >/dev/null 2>&1 && command -v mpiexec >/dev/null 2>&1 \
  && ldconfig -p 2>/dev/null | grep -q libclang; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq mpich libmpich-dev libclang-dev >/dev/null
mpichversion | head -1
