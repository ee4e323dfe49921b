#!/usr/bin/env bash
# Shoal on a machine with an NVIDIA GPU: build from a clean checkout, run the
# benchmarks on device buffers (threads and forked processes, data checked),
# torch.distributed through LD_PRELOAD, and the GPU goal's figures (N processes
# on one GPU, Shoal against PyTorch's own NCCL, beside a device copy).
#
# Needs: the CUDA toolkit (nvcc, headers; /usr/local/cuda or on PATH), cmake,
# a C++20 compiler, and a CUDA driver with a GPU. Uses ninja when present.
# Does not need hwloc, libfabric, MPI, Catch2 or pkg-config (all switched
# off here); PyTorch is optional (the torch stage is skipped without it).
#
#   bash tools/gpu/check.sh [OUTDIR]       (default: $OUT, else ./gpu-check)
#   STAGES="probe build bench torch perf" selects stages (they run in that
#   order: the goal's figures first); RANKS="1 2 4" the sweeps' rank counts;
#   PERF_MAX=64M the sweeps' largest size; BIG=1G the bandwidth runs' size;
#   BUDGET_S=420 the whole run's time.
#
# Each stage runs under a time limit, capped by what is left of BUDGET_S (a
# lent GPU machine may give 15 minutes in all, its start included: the
# default leaves room for a second, shorter run), and writes
# OUTDIR/<stage>.log; a failed stage never stops the later ones, and a stage
# with under 30 s left is skipped. Inside perf the runs that answer the most
# come first. The last lines (also OUTDIR/summary.txt) give one
# PASS/FAIL/SKIP line per stage. Exit status: 0 when nothing failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUTDIR=${1:-${OUT:-$ROOT/gpu-check}}
mkdir -p "$OUTDIR"
STAGES=${STAGES:-"probe build bench torch perf"}
BUDGET_S=${BUDGET_S:-420}
END_S=$((SECONDS + BUDGET_S))
RANKS=${RANKS:-"1 2 4"}
PERF_MAX=${PERF_MAX:-64M}
BIG=${BIG:-1G}
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
export PYTHONUNBUFFERED=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
export PATH=$PATH:/usr/local/cuda/bin
SUMMARY=$OUTDIR/summary.txt
: >"$SUMMARY"

note() { echo "$*" | tee -a "$SUMMARY"; }
wants() { [[ " $STAGES " == *" $1 "* ]]; }

# stage NAME LIMIT_S COMMAND...: runs COMMAND under a limit, logs, records
# (status 77: skipped, with the log's last line as the reason).
stage() {
  local name=$1 limit=$2
  shift 2
  if ! wants "$name"; then note "SKIP $name (not in STAGES)"; return 0; fi
  local left=$((END_S - SECONDS))
  if ((left < 30)); then note "SKIP $name: ${left}s of BUDGET_S=${BUDGET_S} left"; return 0; fi
  ((limit > left)) && limit=$left
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s)" | tee "$OUTDIR/$name.log"
  timeout -k 5 "$limit" bash -c "$*" 2>&1 | tee -a "$OUTDIR/$name.log"
  local rc=${PIPESTATUS[0]}
  local took=$((SECONDS - t0))
  if ((rc == 0)); then note "PASS $name (${took}s)"
  elif ((rc == 77)); then note "SKIP $name: $(tail -1 "$OUTDIR/$name.log")"
  elif ((rc == 124 || rc == 137)); then note "FAIL $name: over ${limit}s"
  else note "FAIL $name: status $rc (${took}s)"; fi
  return 0
}

probe() {
  nvidia-smi -L || true
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  nvcc --version | tail -2 || true
  cmake --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1 || true
  which mpirun ninja pkg-config 2>&1 || true
}

build() {
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  rm -rf "$BUILD"
  # As on a machine without them: no hwloc/libfabric (pkg-config off), no
  # MPI, no Catch2 (tests off); the CUDA path required.
  cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DSHOAL_WITH_CUDA=ON -DSHOAL_WITH_MPI=OFF -DSHOAL_BUILD_TESTS=OFF \
    -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON || return 1
  cmake --build "$BUILD" -j"$(nproc)" --target nccl all_reduce_perf all_gather_perf \
    reduce_scatter_perf broadcast_perf sendrecv_perf || return 1
  if readelf -d "$BUILD/src/api/libnccl.so.2" | grep NEEDED | grep -iE 'cuda|nvidia'; then
    echo "libnccl.so.2 names a CUDA library"; return 1
  fi
  echo "built: $(ls "$BUILD"/src/api/libnccl.so.2)"
}

# One benchmark run; fails on a non-zero status or any wrong element.
perf_run() {
  local bin=$1
  shift
  local log
  log=$(timeout -k 5 120 "$BUILD/bench/perf/$bin" --memory device "$@" 2>&1)
  local rc=$?
  echo "$log"
  if ((rc != 0)) || ! grep -q "Out of bounds values : 0 OK" <<<"$log"; then
    echo "FAILED: $bin --memory device $* (status $rc)"
    return 1
  fi
}

# expect_path WHAT PATTERN LOG: fails, saying so, unless LOG has PATTERN
# (the path the run was meant to take did not run).
expect_path() {
  if grep -qE "$2" <<<"$3"; then return 0; fi
  echo "FAILED: $1 (no \"$2\" in its log)"
  return 1
}

# which_path WHO PLANS ARGS...: a 1 MiB AllReduce of ARGS, its INFO lines
# on the path, and that it went device-direct on PLANS ("stream plans" or
# "device plans"). NCCL_DEBUG_SUBSYS: the INIT and COLL lines, whatever the
# caller set.
which_path() {
  local who=$1 plans=$2 log rc=0
  shift 2
  log=$(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL perf_run all_reduce_perf "$@" -b 1M -e 1M -n 1 -w 0 -c 1 2>&1) ||
    rc=1
  grep -E "device-direct|staged through|stream plans|device plans" <<<"$log" | head -8
  grep -E "^FAILED|Out of bounds" <<<"$log"
  expect_path "$who device-direct" "device-direct: device buffers move GPU to GPU" "$log" || rc=1
  expect_path "$who on $plans" "$plans: operations" "$log" || rc=1
  return $rc
}

perf() {
  local failed=0 log
  # Which path ran, then the bandwidth runs the GPU goal compares: processes
  # device-direct by default (cuda_ipc, stream plans), the same with the
  # host stepping through the plan (device plans: no stream ring), staged
  # through pinned host memory over shm, and threads on the GPU (device
  # plans by default, one GPU copy per message; then stream plans over
  # loopback's stream ring, their streams sharing the GPU's hardware queues).
  echo "--- which path ran (NCCL_DEBUG=INFO)"
  which_path "2 processes" "stream plans" --procs 2 || failed=1
  echo "--- which path ran as threads (NCCL_DEBUG=INFO: device plans; stream plans when told)"
  which_path "2 threads" "device plans" -t 2 || failed=1
  SHOAL_CUDA_STREAM_PLANS=1 which_path "2 threads, SHOAL_CUDA_STREAM_PLANS=1," "stream plans" -t 2 || failed=1
  echo "--- all_reduce_perf: 2 processes, $BIG, bandwidth (device-direct: cuda_ipc, stream plans)"
  perf_run all_reduce_perf --procs 2 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
  echo "--- the same over cuda_ipc, the host stepping through the plan (SHOAL_CUDA_STREAM_PLANS=0: no stream ring)"
  SHOAL_CUDA_STREAM_PLANS=0 perf_run all_reduce_perf --procs 2 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
  echo "--- all_reduce_perf: 2 processes staged over shm, $BIG, bandwidth (NCCL_P2P_DISABLE=1)"
  NCCL_P2P_DISABLE=1 perf_run all_reduce_perf --procs 2 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
  echo "--- all_reduce_perf: 2 ranks as threads, $BIG, bandwidth (device plans: the host steps, one GPU copy per message)"
  perf_run all_reduce_perf -t 2 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
  # The tuner prices GPU links with host figures (4 MiB segments at most):
  # each segment of a host-stepped plan costs a copy and a kernel waited for.
  echo "--- the same in 64 MiB segments (SHOAL_SEGMENT_BYTES: fewer, larger GPU steps)"
  SHOAL_SEGMENT_BYTES=67108864 perf_run all_reduce_perf -t 2 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
  # Stream plans between threads of one GPU: their streams share its
  # hardware queues, so a stream waiting for a peer's word may hold back
  # the peer's own work (a hang would end at perf_run's limit).
  for n in 2 4; do
    echo "--- the same, $n threads on stream plans (SHOAL_CUDA_STREAM_PLANS=1: loopback's stream ring)"
    SHOAL_CUDA_STREAM_PLANS=1 perf_run all_reduce_perf -t "$n" -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
  done
  # Buffers in symmetric windows (-R 2): each rank reads the peers' buffers
  # in place (peer_read plans whole on the streams, meeting on window
  # boards), over the default transport; then the same host-stepped.
  for bin in all_reduce_perf all_gather_perf reduce_scatter_perf; do
    echo "--- $bin: 2 and 4 processes, buffers in windows (-R 2), up to $BIG"
    for n in 2 4; do
      perf_run "$bin" --procs "$n" -R 2 -b 8 -e "$BIG" -f 8 -n 5 -w 2 -c 1 || failed=1
    done
  done
  echo "--- all_reduce_perf, windows, the host stepping through the plan (SHOAL_CUDA_STREAM_PLANS=0: no boards)"
  SHOAL_CUDA_STREAM_PLANS=0 perf_run all_reduce_perf --procs 2 -R 2 -b 1M -e "$BIG" -f 8 -n 5 -w 2 -c 1 || failed=1
  echo "--- which path ran with windows (NCCL_DEBUG=TRACE: calls on the streams, of those reading the peers' windows)"
  NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL perf_run all_reduce_perf --procs 2 -R 2 -b 64K -e 1M -f 16 -n 1 -w 0 -c 1 \
    >"$OUTDIR/windows-trace.log" 2>&1 || failed=1
  log=$(<"$OUTDIR/windows-trace.log")
  grep -c "on the streams, reading the peers' windows" <<<"$log"
  grep -c "reading the peers' windows" <<<"$log"
  expect_path "windows read in place on the streams" "on the streams, reading the peers' windows" "$log" || failed=1
  echo "--- of those, AllReduces in one phase (64K: one_shot_read; 1M: peer_read)"
  grep -c "(one_shot_read) count .* on the streams" <<<"$log"
  expect_path "64 KiB AllReduce on windows in one phase" "\(one_shot_read\) count .* on the streams" "$log" || failed=1
  echo "--- all_reduce_perf: every type and operator, 2 processes"
  perf_run all_reduce_perf --procs 2 -b 1K -e 1M -f 32 -d all -o all -n 2 -w 1 -c 1 || failed=1
  # So few hardware queues that a stream waiting for the host would hold
  # back the host's own GPU work (some trainers set 1): Shoal stages then,
  # copies on the user's stream; these must finish (perf_run's limit), data
  # checked.
  echo "--- all_reduce_perf, CUDA_DEVICE_MAX_CONNECTIONS=1: 2 ranks as threads and as processes (staged)"
  CUDA_DEVICE_MAX_CONNECTIONS=1 perf_run all_reduce_perf -t 2 -b 8 -e 16M -f 16 -n 5 -w 2 -c 1 || failed=1
  CUDA_DEVICE_MAX_CONNECTIONS=1 perf_run all_reduce_perf --procs 2 -b 8 -e 16M -f 16 -n 5 -w 2 -c 1 || failed=1
  # The sweeps of every collective, threads and device-direct processes,
  # then staged processes beside them.
  for bin in all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf sendrecv_perf; do
    for n in $RANKS; do
      echo "--- $bin: $n ranks as threads"
      perf_run "$bin" -t "$n" -b 8 -e "$PERF_MAX" -f 8 -n 5 -w 2 -c 1 || failed=1
      if ((n > 1)); then
        echo "--- $bin: $n ranks as processes"
        perf_run "$bin" --procs "$n" -b 8 -e "$PERF_MAX" -f 8 -n 5 -w 2 -c 1 || failed=1
      fi
    done
  done
  for bin in all_reduce_perf all_gather_perf reduce_scatter_perf; do
    echo "--- $bin: 2 processes staged over shm (NCCL_P2P_DISABLE=1)"
    NCCL_P2P_DISABLE=1 perf_run "$bin" --procs 2 -b 8 -e "$PERF_MAX" -f 8 -n 5 -w 2 -c 1 || failed=1
  done
  return $failed
}

torch_stage() {
  if ! python3 -c 'import torch, torch.distributed' 2>/dev/null; then
    echo "PyTorch is not installed"; return 77
  fi
  local lib
  lib=$(readlink -f "$BUILD/src/api/libnccl.so.2")
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_PRELOAD=$lib \
    python3 -m torch.distributed.run --standalone --nproc_per_node 2 "$ROOT/tools/gpu/torch_check.py"
}

# The goal's figures (torch_bench.py): N processes on one GPU, Shoal's stream
# plans over cuda_ipc and PyTorch's own NCCL, beside a device copy and the bound.
bench_stage() {
  if ! python3 -c 'import torch, torch.distributed' 2>/dev/null; then
    echo "PyTorch is not installed"; return 77
  fi
  local lib failed=0
  lib=$(readlink -f "$BUILD/src/api/libnccl.so.2")
  for n in 2 4; do
    BENCH_LABEL="shoal cuda_ipc $n ranks" LD_PRELOAD=$lib \
      python3 -m torch.distributed.run --standalone --nproc_per_node "$n" "$ROOT/tools/gpu/torch_bench.py" || failed=1
    BENCH_LABEL="pytorch nccl $n ranks" NCCL_MULTI_RANK_GPU_ENABLE=1 \
      python3 -m torch.distributed.run --standalone --nproc_per_node "$n" "$ROOT/tools/gpu/torch_bench.py" || true
  done
  return $failed
}

stage probe 30 "$(declare -f probe); probe"
stage build 240 "$(declare -f build); ROOT='$ROOT' BUILD='$BUILD' build"
stage bench 180 "$(declare -f bench_stage); ROOT='$ROOT' BUILD='$BUILD' bench_stage"
stage torch 90 "$(declare -f torch_stage); ROOT='$ROOT' BUILD='$BUILD' torch_stage"
stage perf 420 "$(declare -f perf perf_run expect_path which_path); BUILD='$BUILD' RANKS='$RANKS' PERF_MAX='$PERF_MAX' BIG='$BIG' OUTDIR='$OUTDIR' perf"

echo "=== summary"
cat "$SUMMARY"
! grep -q '^FAIL' "$SUMMARY"
