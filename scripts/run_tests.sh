#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test.
# All traffic stays on loopback or in namespaces the tests create.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
# The library also builds without CUDA (host memory only), as on a machine
# without the toolkit.
cmake -S . -B build-nocuda -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_WITH_CUDA=OFF \
  -DSHOAL_BUILD_TESTS=OFF -DSHOAL_BUILD_BENCH=OFF >/dev/null
cmake --build build-nocuda -j"$(nproc)" --target nccl
export NCCL_SOCKET_IFNAME=lo FI_TCP_IFACE=lo
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd build
ctest --output-on-failure --no-tests=error --timeout 900 "$@"
