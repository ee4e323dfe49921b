#!/usr/bin/env bash
# Side-by-side AllReduce (and other collectives) on local ranks: Shoal's
# nccl-tests-compatible benchmark next to Open MPI (tcp and shared memory) and
# Gloo, interleaved (A B C A B C ...) in one run, medians per size.
#
#   bench/compare/compare.sh [-n NP] [-r REPEATS] [-o allreduce|allgather|reduce_scatter]
#                            [-b MIN] [-e MAX] [--out DIR]
#
# The peers' benchmark programs are the shared measurement programs in
# ../shared/peers/src (built into a temporary folder at run time, never copied
# here); Shoal's is build/bench/perf. Every byte stays on loopback.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PEERS=${PEERS:-$ROOT/../shared/peers}
NP=2; REPEATS=3; OP=allreduce; MINB=8; MAXB=64M; OUT=$ROOT/build/compare
while (($#)); do
  case "$1" in
    -n) NP=$2; shift 2 ;;
    -r) REPEATS=$2; shift 2 ;;
    -o) OP=$2; shift 2 ;;
    -b) MINB=$2; shift 2 ;;
    -e) MAXB=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_SOCKET_IFNAME=lo FI_TCP_IFACE=lo
M="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo -np $NP"

case "$OP" in
  allreduce) SHOAL_BIN=all_reduce_perf ;;
  allgather) SHOAL_BIN=all_gather_perf ;;
  reduce_scatter) SHOAL_BIN=reduce_scatter_perf ;;
  *) echo "unsupported -o $OP" >&2; exit 2 ;;
esac
[ -x "$ROOT/build/bench/perf/$SHOAL_BIN" ] || { echo "build Shoal first (scripts/build.sh)" >&2; exit 1; }

have_peers=0
if [ -d "$PEERS/src" ]; then
  mpicxx -O2 -std=c++17 -o "$TMP/mpi_bench" "$PEERS/src/mpi_allreduce_bench.cc" && have_peers=1
  if dpkg -s libgloo-dev >/dev/null 2>&1; then
    g++ -O2 -std=c++17 -o "$TMP/gloo_bench" "$PEERS/src/gloo_bench.cc" -lgloo -lpthread || true
  fi
fi

run() {  # name, command...
  local name=$1; shift
  echo "### $name" >>"$OUT/raw.txt"
  timeout 600 "$@" >"$TMP/out.txt" 2>&1 || echo "# $name failed" >>"$OUT/raw.txt"
  python3 "$ROOT/bench/compare/parse.py" "$name" <"$TMP/out.txt" >>"$OUT/rows.csv"
}

: >"$OUT/raw.txt"; echo "library,bytes,time_us,busbw" >"$OUT/rows.csv"
for ((rep = 0; rep < REPEATS; rep++)); do
  run shoal_tcp $M -x NCCL_SOCKET_IFNAME "$ROOT/build/bench/perf/$SHOAL_BIN" -b "$MINB" -e "$MAXB" -f 4 -c 0 -n 20 -w 3
  if ((have_peers)); then
    run mpi_tcp $M --mca pml ob1 --mca btl tcp,self "$TMP/mpi_bench" -o "$OP" -b "$MINB" -e "$MAXB" -f 4 -t 0.1 -R 1
    run mpi_shm $M --mca pml ob1 --mca btl vader,self "$TMP/mpi_bench" -o "$OP" -b "$MINB" -e "$MAXB" -f 4 -t 0.1 -R 1
    if [ -x "$TMP/gloo_bench" ]; then
      run gloo_ring "$PEERS/launch_local.sh" "$NP" 280 "$TMP/gloo_bench" -o "$OP" -A ring -b "$MINB" -e "$MAXB" -f 4 -t 0.1 -R 1
    fi
  fi
done
python3 "$ROOT/bench/compare/summarize.py" "$OUT/rows.csv" | tee "$OUT/table.md"
