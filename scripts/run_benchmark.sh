#!/usr/bin/env bash
# The README's main job: installs dependencies, builds, and runs the all-reduce
# benchmark over 2 local ranks under mpirun, 8 B to 64 MiB, data check on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
export NCCL_SOCKET_IFNAME=lo FI_TCP_IFACE=lo
mpirun --allow-run-as-root -np 2 --bind-to none \
  --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo \
  -x NCCL_SOCKET_IFNAME -x FI_TCP_IFACE \
  build/bench/perf/all_reduce_perf -b 8 -e 64M -f 2 -c 1 "$@"
