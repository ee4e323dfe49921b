#!/usr/bin/env bash
# Configures and builds Shoal into ./build (Release with debug info).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
# The configure log is kept; what matters (what was found, what is missing,
# warnings and errors) is shown, and a failed configure stops here.
if ! cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >build/configure.log 2>&1; then
  cat build/configure.log
  exit 1
fi
grep -E '^-- shoal|^CMake (Warning|Error)|^  shoal' build/configure.log || true
cmake --build build -j"$(nproc)"
