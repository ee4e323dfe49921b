#!/usr/bin/env bash
# Shoal on a machine with an NVIDIA GPU: build from a clean checkout, run the
# benchmarks on device buffers (threads and forked processes, data checked),
# torch.distributed through LD_PRELOAD, and the GPU goal's figures: AllReduce,
# AllGather and ReduceScatter at BIG with 2 ranks on one GPU, as threads and
# as processes, beside the device-copy bound B(N-1)/N^2, and the 8 B
# AllReduce latency.
#
# Needs: the CUDA toolkit (nvcc, headers; /usr/local/cuda or on PATH), cmake,
# a C++20 compiler, and a CUDA driver with a GPU. Uses ninja when present.
# Does not need hwloc, libfabric, MPI, Catch2 or pkg-config (all switched
# off here); PyTorch is optional (the torch and bench stages are skipped
# without it, and the bound is not known).
#
#   bash tools/gpu/check.sh [OUTDIR]       (default: $OUT, else ./gpu-check)
#   STAGES="probe build perf torch bench" selects stages; RANKS="1 2 4" the
#   sweeps' rank counts; PERF_MAX=64M the sweeps' largest size; BIG=1G the
#   bandwidth runs' size; BUDGET_S=420 the whole run's time.
#
# Stages, in this order: probe (the machine; what its driver answers where
# the stand-in refuses on purpose, tools/gpu/driver_probe.cc; with PyTorch,
# the device copy bandwidth B), build, perf (the goal's figures, the staged AllReduce beside
# them, and the checks of which path ran), torch (torch.distributed on Shoal), bench (the goal's figures through
# PyTorch), sweeps (everything else the benchmarks check: variants, windows,
# every type and operator, every collective). "perf" in STAGES selects both
# perf and sweeps; "sweeps" alone the second part.
#
# Each stage runs under a time limit, capped by what is left of BUDGET_S (a
# lent GPU machine may give 15 minutes in all, its start included: the
# default leaves room for a second, shorter run) less a reserve for the
# stages after it, and writes OUTDIR/<stage>.log straight to the file; a
# stage with under 30 s left is skipped, and a failed stage never stops the
# later ones. When a stage ends, whatever it started and left running is
# killed (found by a tag in its environment: torchrun starts its workers in
# sessions of their own). Each benchmark and torchrun run has its own limit
# and adds one line to OUTDIR/summary.txt: PASS, FAIL or TIMEOUT, its time,
# the run, and for bandwidth runs the busbw against the bound. Per stage:
# PASS, FAIL, SKIP, or INCOMPLETE when it reached its limit with no run
# failed (the runs after were not made). OUTDIR holds at most 8 files.
# Exit status: 0 when no stage failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
OUTDIR=${1:-${OUT:-$ROOT/gpu-check}}
mkdir -p "$OUTDIR" || exit 1
STAGES=${STAGES:-"probe build perf torch bench"}
BUDGET_S=${BUDGET_S:-420}
END_S=$((SECONDS + BUDGET_S))
RANKS=${RANKS:-"1 2 4"}
PERF_MAX=${PERF_MAX:-64M}
BIG=${BIG:-1G}
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
SUMMARY=$OUTDIR/summary.txt
COPY_GBS=""  # B, the device copy's read + write GB/s, from the probe
NV_NCCL=""   # the version of PyTorch's own NCCL, from the probe
export ROOT OUTDIR BUILD SUMMARY RANKS PERF_MAX BIG COPY_GBS NV_NCCL
export PYTHONUNBUFFERED=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
export PATH=$PATH:/usr/local/cuda/bin
: >"$SUMMARY"

note() { echo "$*" | tee -a "$SUMMARY"; }
wants() {
  [[ " $STAGES " == *" $1 "* ]] || { [[ $1 == sweeps && " $STAGES " == *" perf "* ]]; }
}

# kill_tagged VAR=VALUE: kills (SIGKILL) every process whose environment
# holds VAR=VALUE, saying how many there were. The tags are set on one
# command only, so the caller never carries the one it looks for.
kill_tagged() {
  local files=() pids=() f p
  mapfile -t files < <(grep -lzxF -- "$1" /proc/[0-9]*/environ 2>/dev/null)
  for f in "${files[@]}"; do
    p=${f#/proc/}
    p=${p%/environ}
    [[ $p == "$$" || $p == "$BASHPID" ]] || pids+=("$p")
  done
  ((${#pids[@]})) || return 0
  echo "killing ${#pids[@]} processes left running ($1): ${pids[*]}"
  kill -9 "${pids[@]}" 2>/dev/null
  return 0
}

# record STATUS T0 WHAT [FIGURES]: one run's line, in the log and the summary.
record() {
  local line
  printf -v line '  %-8s %4ds  %s' "$1" $((SECONDS - $2)) "$3"
  [[ -n ${4:-} ]] && line+=": $4"
  echo "$line"
  echo "$line" >>"$SUMMARY"
}

# stage NAME LIMIT RESERVE FUNCTION: runs FUNCTION (bash -c, the functions
# exported) under a limit, capped by what is left of BUDGET_S less RESERVE
# seconds for the stages after it (but 30 s at least), its output straight
# into OUTDIR/NAME.log (no pipe: a process left running would hold a pipe
# open), then kills what it left running, prints the log and records the
# stage (status 77: skipped, with the log's last line as the reason).
CURRENT_TAG=none
stage() {
  local name=$1 limit=$2 reserve=$3 fn=$4
  if ! wants "$name"; then note "SKIP $name (not in STAGES)"; return 0; fi
  local left=$((END_S - SECONDS))
  if ((left < 30)); then note "SKIP $name: ${left}s of BUDGET_S=${BUDGET_S} left"; return 0; fi
  ((limit > left - reserve)) && limit=$((left - reserve))
  ((limit < 30)) && limit=30
  local log=$OUTDIR/$name.log t0=$SECONDS rc first runs bad made cut
  CURRENT_TAG=$name-$$
  first=$(($(wc -l <"$SUMMARY") + 1))
  echo "=== $name (limit ${limit}s)" >"$log"
  SHOAL_CHECK_STAGE=$CURRENT_TAG timeout -k 5 "$limit" bash -c "$fn" >>"$log" 2>&1 </dev/null
  rc=$?
  kill_tagged "SHOAL_CHECK_STAGE=$CURRENT_TAG" >>"$log"
  CURRENT_TAG=none
  cat "$log"
  runs=$(tail -n +"$first" "$SUMMARY")
  bad=$(grep -cE '^  (FAIL|TIMEOUT) ' <<<"$runs")
  made=$(grep -cE '^  [A-Z]+ ' <<<"$runs")
  local took=$((SECONDS - t0))
  if ((rc == 124 || rc == 137)); then
    if ((made == 0)); then note "FAIL $name: over its ${limit}s limit"; return 0; fi
    # The run it cut short: the last one begun ("+ ...") and not recorded.
    cut=$(awk '/^\+ / { run = substr($0, 3) } /^  [A-Z]+ +[0-9]+s  / { run = "" } END { print run }' "$log")
    cut=${cut:+; cut short: $cut}
    if ((bad > 0)); then note "FAIL $name: $bad of $made runs failed; stopped at its ${limit}s limit$cut"
    else note "INCOMPLETE $name: stopped at its ${limit}s limit after $made runs, none failed$cut"; fi
  elif ((rc == 0)); then note "PASS $name (${took}s$( ((made)) && echo ", $made runs"))"
  elif ((rc == 77)); then note "SKIP $name: $(tail -1 "$log")"
  elif ((made)); then note "FAIL $name: status $rc (${took}s; $bad of $made runs failed)"
  else note "FAIL $name: status $rc (${took}s): $(tail -1 "$log")"; fi
  return 0
}

probe_stage() {
  local c
  for c in nvcc gcc g++ cmake ninja python3 nvidia-smi mpirun pkg-config; do
    echo "$c: $(command -v "$c" || echo "not found")"
  done
  g++ --version | head -1
  nvcc --version | tail -2
  cmake --version | head -1
  echo "kernel $(uname -r), $(nproc) cores; LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  ldconfig -p | grep 'libcuda\.so\.1' || echo "libcuda.so.1: not in ldconfig's cache"
  df -h /dev/shm
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  fi
  # What the driver answers where Shoal's stand-in refuses on purpose
  # (tools/gpu/driver_probe.cc: pointer queries with no context current,
  # cuFuncLoad's version, DEVICEMAP, calls during another thread's capture).
  local cuda_inc probe_dir
  cuda_inc=$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/../include
  probe_dir=$(mktemp -d)
  if g++ -std=c++20 -I"$cuda_inc" "$ROOT/tools/gpu/driver_probe.cc" -ldl -pthread -o "$probe_dir/driver_probe"; then
    timeout -k 5 30 "$probe_dir/driver_probe" || echo "driver probe: status $?"
  else
    echo "driver probe: did not build"
  fi
  rm -rf "$probe_dir"
  # PyTorch, the NCCL it loads by itself, and B (a 1 GiB device copy).
  if python3 -c 'import torch' 2>/dev/null; then
    timeout -k 5 45 python3 "$ROOT/tools/gpu/torch_bench.py" --probe
  else
    echo "PyTorch is not installed"
  fi
  return 0
}

build_stage() {
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
  need_lib || return 1
  if readelf -d "$LIB" | grep NEEDED | grep -iE 'cuda|nvidia'; then
    echo "libnccl.so.2 names a CUDA library"; return 1
  fi
  echo "built: $LIB"
}

# need_lib: sets LIB to this build's libnccl.so.2, or says why not and fails
# (never let a run fall back on NVIDIA's NCCL unnoticed).
need_lib() {
  if [[ ! -f $BUILD/src/api/libnccl.so.2 ]]; then
    echo "no $BUILD/src/api/libnccl.so.2: the build stage failed or did not run"
    return 1
  fi
  LIB=$(readlink -f "$BUILD/src/api/libnccl.so.2")
}

need_bins() {
  local bin
  for bin in all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf sendrecv_perf; do
    if [[ ! -x $BUILD/bench/perf/$bin ]]; then
      echo "no $BUILD/bench/perf/$bin: the build stage failed or did not run"
      return 1
    fi
  done
}

have_torch() {
  python3 -c 'import torch, torch.distributed' 2>/dev/null && return 0
  echo "PyTorch is not installed"
  return 1
}

# bench_exec [-l LIMIT] [VAR=VALUE...] BIN ARGS...: runs this build's BIN on
# device buffers with the environment given, under LIMIT seconds (90 by
# default), in the foreground of the stage's process group (so that the
# stage's own limit ends it too); its output goes to a file, and whatever it
# left running is killed (its forked ranks die with it, but a file holds no
# one up). Sets RUN_LOG (its output), RUN_RC, RUN_T0, RUN_WHAT (the run as a
# command line) and RUN_RANKS (processes x threads).
bench_exec() {
  local limit=90 envs=() procs=1 threads=1 prev="" a out tag=bench-$BASHPID-$RANDOM
  if [[ $1 == -l ]]; then limit=$2; shift 2; fi
  while [[ $1 == *=* ]]; do envs+=("$1"); shift; done
  for a in "$@"; do
    case $prev in -t) threads=$a ;; --procs) procs=$a ;; esac
    prev=$a
  done
  RUN_RANKS=$((procs * threads))
  RUN_WHAT="${envs[*]}${envs[*]:+ }$*"
  RUN_T0=$SECONDS
  echo "+ $RUN_WHAT"
  out=$(mktemp)
  SHOAL_CHECK_RUN=$tag timeout --foreground -k 5 "$limit" env "${envs[@]}" \
    "$BUILD/bench/perf/$1" --memory device "${@:2}" >"$out" 2>&1 </dev/null
  RUN_RC=$?
  kill_tagged "SHOAL_CHECK_RUN=$tag" >>"$out"
  RUN_LOG=$(<"$out")
  rm -f "$out"
}

# bench_status: PASS, or FAIL (a non-zero status or any wrong element), or
# TIMEOUT, for the last bench_exec.
bench_status() {
  if ((RUN_RC == 124 || RUN_RC == 137)); then echo TIMEOUT
  elif ((RUN_RC != 0)) || ! grep -q "Out of bounds values : 0 OK" <<<"$RUN_LOG"; then echo FAIL
  else echo PASS; fi
}

# figures: the last size of the last bench_exec: time and busbw out of place
# and in place; from 1 MiB, the busbw as a share of the bound B(N-1)/N^2 for
# its N ranks on one GPU, where the probe measured B.
figures() {
  awk -v n="$RUN_RANKS" -v b="${COPY_GBS:-0}" '
    $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 13 { row = $0 }
    END {
      if (row == "") exit
      split(row, f)
      if (f[1] >= 1073741824) size = sprintf("%g GiB", f[1] / 1073741824)
      else if (f[1] >= 1048576) size = sprintf("%g MiB", f[1] / 1048576)
      else size = f[1] " B"
      s = sprintf("%s, N=%d: %s us, busbw %s GB/s out of place; %s us, %s GB/s in place",
                  size, n, f[6], f[8], f[10], f[12])
      bound = b * (n - 1) / (n * n)
      if (bound > 0 && f[1] >= 1048576)
        s = s sprintf("; %.0f%% and %.0f%% of the bound %.0f GB/s", 100 * f[8] / bound, 100 * f[12] / bound, bound)
      print s
    }' <<<"$RUN_LOG"
}

# perf_run [-l LIMIT] [VAR=VALUE...] BIN ARGS...: one benchmark run, its
# output, and its line in the summary; fails on a non-zero status, any wrong
# element or its limit.
perf_run() {
  local status
  bench_exec "$@"
  echo "$RUN_LOG"
  status=$(bench_status)
  [[ $status == PASS ]] || echo "FAILED: $RUN_WHAT (status $RUN_RC)"
  record "$status" "$RUN_T0" "$RUN_WHAT" "$(figures)"
  [[ $status == PASS ]]
}

# expect_path WHAT PATTERN LOG: fails, saying so, unless LOG has PATTERN
# (the path the run was meant to take did not run).
expect_path() {
  if grep -qE "$2" <<<"$3"; then return 0; fi
  echo "FAILED: $1 (no \"$2\" in its log)"
  return 1
}

# which_path WHO PLANS [-l LIMIT] [VAR=VALUE...] ARGS...: a 1 MiB AllReduce
# of ARGS, its INFO lines on the path, and that it went device-direct on
# PLANS ("stream plans" or "device plans"). NCCL_DEBUG_SUBSYS: the INIT and
# COLL lines, whatever the caller set.
which_path() {
  local who=$1 plans=$2 lim=(-l 90) envs=() status
  shift 2
  if [[ $1 == -l ]]; then lim=(-l "$2"); shift 2; fi
  while [[ $1 == *=* ]]; do envs+=("$1"); shift; done
  bench_exec "${lim[@]}" "${envs[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL all_reduce_perf "$@" \
    -b 1M -e 1M -n 1 -w 0 -c 1
  grep -E "device-direct|staged through|stream plans|device plans" <<<"$RUN_LOG" | head -8
  grep -E "Out of bounds" <<<"$RUN_LOG"
  status=$(bench_status)
  if [[ $status == PASS ]]; then
    expect_path "$who device-direct" "device-direct: device buffers move GPU to GPU" "$RUN_LOG" || status=FAIL
    expect_path "$who on $plans" "$plans: operations" "$RUN_LOG" || status=FAIL
  else
    echo "FAILED: $RUN_WHAT (status $RUN_RC)"
  fi
  record "$status" "$RUN_T0" "which path: $who, device-direct on $plans (${envs[*]}${envs[*]:+ }$*)"
  [[ $status == PASS ]]
}

# windows_path: AllReduces on buffers in windows (-R 2), traced: calls read
# the peers' windows on the streams, and 64 KiB ones in one phase.
windows_path() {
  local status
  echo "--- which path ran with windows (NCCL_DEBUG=TRACE: calls on the streams, of those reading the peers' windows)"
  bench_exec NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL all_reduce_perf --procs 2 -R 2 -b 64K -e 1M -f 16 -n 1 -w 0 -c 1
  printf '%s\n' "$RUN_LOG" >"$OUTDIR/windows-trace.log"
  grep -E "Out of bounds" <<<"$RUN_LOG"
  status=$(bench_status)
  grep -c "on the streams, reading the peers' windows" <<<"$RUN_LOG"
  grep -c "reading the peers' windows" <<<"$RUN_LOG"
  echo "--- of those, AllReduces in one phase (64K: one_shot_read; 1M: peer_read)"
  grep -c "(one_shot_read) count .* on the streams" <<<"$RUN_LOG"
  if [[ $status == PASS ]]; then
    expect_path "windows read in place on the streams" "on the streams, reading the peers' windows" "$RUN_LOG" ||
      status=FAIL
    expect_path "64 KiB AllReduce on windows in one phase" "\(one_shot_read\) count .* on the streams" "$RUN_LOG" ||
      status=FAIL
  else
    echo "FAILED: $RUN_WHAT (status $RUN_RC)"
  fi
  record "$status" "$RUN_T0" "which path: windows (-R 2) read in place on the streams, 64 KiB in one phase"
  [[ $status == PASS ]]
}

# The checks of which path ran (processes device-direct by default: cuda_ipc,
# stream plans; threads on device plans: the host steps, one GPU copy per
# message), the goal's figures, staging beside them, and windows read in
# place.
perf_stage() {
  need_bins || return 1
  local failed=0 bin
  echo "--- which path ran (NCCL_DEBUG=INFO): processes on stream plans, threads on device plans"
  which_path "2 processes" "stream plans" --procs 2 || failed=1
  which_path "2 threads" "device plans" -t 2 || failed=1
  echo "--- the goal's figures: $BIG, 2 ranks on one GPU as processes (cuda_ipc, stream plans) and as threads (device plans)"
  for bin in all_reduce_perf all_gather_perf reduce_scatter_perf; do
    perf_run "$bin" --procs 2 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
    perf_run "$bin" -t 2 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
  done
  echo "--- the goal's latency: 8 B AllReduce, 2 processes and 2 threads"
  perf_run -l 60 all_reduce_perf --procs 2 -b 8 -e 8 -n 500 -w 50 -c 1 || failed=1
  perf_run -l 60 all_reduce_perf -t 2 -b 8 -e 8 -n 500 -w 50 -c 1 || failed=1
  echo "--- the same in a CUDA graph (-G: 100 calls captured, launched 5 times; replayed as device plans, a host callback per call)"
  perf_run -l 60 all_reduce_perf --procs 2 -b 8 -e 8 -n 100 -w 50 -c 1 -G 5 || failed=1
  echo "--- $BIG AllReduce in a CUDA graph, 2 processes (replayed as device plans: GPU copies and kernels, host-stepped)"
  perf_run all_reduce_perf --procs 2 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 -G 2 || failed=1
  # Device-direct is the default where the GPU run confirms it beats staging
  # (docs/decisions/0017-device-direct-by-default.md): the staged figure.
  echo "--- $BIG AllReduce, 2 processes staged through pinned host memory over shm (NCCL_P2P_DISABLE=1)"
  perf_run NCCL_P2P_DISABLE=1 all_reduce_perf --procs 2 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
  windows_path || failed=1
  return $failed
}

# Everything else, the answers that matter most first; runs that may hang
# have short limits.
sweeps_stage() {
  need_bins || return 1
  local failed=0 bin n
  echo "--- $BIG, 4 ranks as processes (the bound at 4 ranks)"
  for bin in all_reduce_perf all_gather_perf reduce_scatter_perf; do
    perf_run "$bin" --procs 4 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
  done
  # Buffers in symmetric windows (-R 2): each rank reads the peers' buffers
  # in place (peer_read plans whole on the streams, meeting on window boards).
  echo "--- $BIG, 2 processes, buffers in windows (-R 2)"
  for bin in all_reduce_perf all_gather_perf reduce_scatter_perf; do
    perf_run "$bin" --procs 2 -R 2 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
  done
  # Stream plans between threads of one GPU: their streams share its
  # hardware queues, so a stream waiting for a peer's word may hold back the
  # peer's own work. A hang of the 1 MiB check ends at 30 s, and then the
  # larger runs are not made; theirs at 45 s.
  echo "--- threads on stream plans (SHOAL_CUDA_STREAM_PLANS=1: loopback's stream ring; short limits)"
  if which_path "2 threads" "stream plans" -l 30 SHOAL_CUDA_STREAM_PLANS=1 -t 2; then
    for n in 2 4; do
      perf_run -l 45 SHOAL_CUDA_STREAM_PLANS=1 all_reduce_perf -t "$n" -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
    done
  else
    failed=1
    echo "not made: $BIG on stream plans between threads"
  fi
  echo "--- $BIG AllReduce, 2 processes over cuda_ipc, the host stepping through the plan (SHOAL_CUDA_STREAM_PLANS=0: no stream ring)"
  perf_run SHOAL_CUDA_STREAM_PLANS=0 all_reduce_perf --procs 2 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
  # The tuner prices GPU links with host figures (4 MiB segments at most):
  # each segment of a host-stepped plan costs a copy and a kernel waited for.
  echo "--- $BIG AllReduce, 2 threads in 64 MiB segments (SHOAL_SEGMENT_BYTES: fewer, larger GPU steps)"
  perf_run SHOAL_SEGMENT_BYTES=67108864 all_reduce_perf -t 2 -b "$BIG" -e "$BIG" -n 5 -w 2 -c 1 || failed=1
  echo "--- windows, the host stepping through the plan (SHOAL_CUDA_STREAM_PLANS=0: no boards)"
  perf_run SHOAL_CUDA_STREAM_PLANS=0 all_reduce_perf --procs 2 -R 2 -b 1M -e "$BIG" -f 8 -n 5 -w 2 -c 1 || failed=1
  echo "--- every type and operator, 2 processes"
  perf_run all_reduce_perf --procs 2 -b 1K -e 1M -f 32 -d all -o all -n 2 -w 1 -c 1 || failed=1
  # So few hardware queues that a stream waiting for the host would hold
  # back the host's own GPU work (some trainers set 1): Shoal stages then,
  # copies on the user's stream; these must finish, data checked.
  echo "--- CUDA_DEVICE_MAX_CONNECTIONS=1: 2 ranks as threads and as processes (staged; 60 s limits)"
  perf_run -l 60 CUDA_DEVICE_MAX_CONNECTIONS=1 all_reduce_perf -t 2 -b 8 -e 16M -f 16 -n 5 -w 2 -c 1 || failed=1
  perf_run -l 60 CUDA_DEVICE_MAX_CONNECTIONS=1 all_reduce_perf --procs 2 -b 8 -e 16M -f 16 -n 5 -w 2 -c 1 || failed=1
  echo "--- windows (-R 2), 2 and 4 processes, up to $PERF_MAX"
  for bin in all_reduce_perf all_gather_perf reduce_scatter_perf; do
    for n in 2 4; do
      perf_run "$bin" --procs "$n" -R 2 -b 8 -e "$PERF_MAX" -f 8 -n 5 -w 2 -c 1 || failed=1
    done
  done
  # The sweeps of every collective, threads and device-direct processes,
  # then staged processes beside them.
  for bin in all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf sendrecv_perf; do
    echo "--- $bin: ${RANKS// /, } ranks as threads, and as processes from 2, up to $PERF_MAX"
    for n in $RANKS; do
      perf_run "$bin" -t "$n" -b 8 -e "$PERF_MAX" -f 8 -n 5 -w 2 -c 1 || failed=1
      if ((n > 1)); then
        perf_run "$bin" --procs "$n" -b 8 -e "$PERF_MAX" -f 8 -n 5 -w 2 -c 1 || failed=1
      fi
    done
  done
  echo "--- staged over shm (NCCL_P2P_DISABLE=1), 2 processes, up to $PERF_MAX"
  for bin in all_reduce_perf all_gather_perf reduce_scatter_perf; do
    perf_run NCCL_P2P_DISABLE=1 "$bin" --procs 2 -b 8 -e "$PERF_MAX" -f 8 -n 5 -w 2 -c 1 || failed=1
  done
  return $failed
}

# free_port: a TCP port on 127.0.0.1 nobody listens on now.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run_torch LIMIT NPROC SCRIPT [VAR=VALUE...]: torchrun, NPROC workers of
# tools/gpu/SCRIPT with the environment given, under LIMIT seconds. The
# rendezvous is static on 127.0.0.1 and a free port (--standalone would
# publish the host's FQDN, which may not resolve on a machine without DNS).
# torchrun starts each worker in a session of its own, out of reach of the
# timeout's signal: whatever is left when it ends is found by a tag in its
# environment and killed. Its output goes to a file (a surviving worker
# would hold a pipe open), printed after. Sets RUN_LOG (that file), RUN_RC
# and RUN_T0.
run_torch() {
  local limit=$1 nproc=$2 script=$3 tag port
  shift 3
  tag=torchrun-$BASHPID-$RANDOM
  RUN_T0=$SECONDS
  echo "+ ${*:+$* }torchrun --nproc-per-node $nproc $script"
  RUN_LOG=$(mktemp)
  port=$(free_port) || { RUN_RC=1; return 1; }
  SHOAL_CHECK_RUN=$tag OMP_NUM_THREADS=1 timeout -k 5 "$limit" env "$@" \
    python3 -m torch.distributed.run --nnodes 1 --nproc-per-node "$nproc" \
    --master-addr 127.0.0.1 --master-port "$port" --local-addr 127.0.0.1 \
    "$ROOT/tools/gpu/$script" >"$RUN_LOG" 2>&1 </dev/null
  RUN_RC=$?
  kill_tagged "SHOAL_CHECK_RUN=$tag" >>"$RUN_LOG"
  cat "$RUN_LOG"
}

run_status() {
  if ((RUN_RC == 124 || RUN_RC == 137)); then echo TIMEOUT
  elif ((RUN_RC != 0)); then echo FAIL
  else echo PASS; fi
}

torch_stage() {
  have_torch || return 77
  need_lib || return 1
  local status
  run_torch 75 2 torch_check.py NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_PRELOAD="$LIB"
  status=$(run_status)
  record "$status" "$RUN_T0" "torch_check.py: torch.distributed, 2 processes on one GPU, Shoal in LD_PRELOAD" \
    "$(grep -m1 -o 'NCCL in use: [^;]*' "$RUN_LOG")"
  rm -f "$RUN_LOG"
  [[ $status == PASS ]]
}

# The goal's figures through PyTorch (torch_bench.py): N processes on one
# GPU, Shoal's stream plans over cuda_ipc, beside a device copy and the
# bound; PyTorch's own NCCL only where it accepts several ranks per GPU.
bench_stage() {
  have_torch || return 77
  need_lib || return 1
  local failed=0 n status nv major minor refused=""
  for n in 2 4; do
    run_torch 60 "$n" torch_bench.py LD_PRELOAD="$LIB" BENCH_LABEL="shoal $n ranks" BENCH_EXPECT=shoal
    status=$(run_status)
    record "$status" "$RUN_T0" "torch_bench.py: Shoal, $n processes on one GPU"
    grep '^\[' "$RUN_LOG" | sed 's/^/    /' >>"$SUMMARY"
    rm -f "$RUN_LOG"
    [[ $status == PASS ]] || failed=1
  done
  # NVIDIA's NCCL refuses several ranks on one GPU at init ("Duplicate GPU
  # detected") unless it is recent enough to honour
  # NCCL_MULTI_RANK_GPU_ENABLE=1 (not before 2.30); PyTorch 2.11 bundles
  # 2.28.9. No 1-rank run instead: a 1-rank AllReduce in place does no
  # device work, so it would time PyTorch's call overhead, not the GPU
  # sharing the goal is about, and device time is short.
  nv=${NV_NCCL:-$(timeout -k 5 60 python3 "$ROOT/tools/gpu/torch_bench.py" --nccl-version 2>/dev/null | tail -1)}
  IFS=. read -r major minor _ <<<"$nv"
  if [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ ]] && ((major < 2 || (major == 2 && minor < 30))); then
    refused=$nv
  else
    for n in 2 4; do
      run_torch 60 "$n" torch_bench.py BENCH_LABEL="pytorch nccl $n ranks" NCCL_MULTI_RANK_GPU_ENABLE=1
      if grep -qE "Duplicate GPU detected|Multiple Ranks are using the same GPU" "$RUN_LOG"; then
        refused=${nv:-unknown}
        rm -f "$RUN_LOG"
        break
      fi
      # Not Shoal's result: noted, never failed.
      status=$(run_status)
      [[ $status == PASS ]] || status=NOTE
      record "$status" "$RUN_T0" "torch_bench.py: PyTorch's own NCCL ${nv:-(version unknown)}, $n processes on one GPU"
      grep '^\[' "$RUN_LOG" | sed 's/^/    /' >>"$SUMMARY"
      rm -f "$RUN_LOG"
    done
  fi
  if [[ -n $refused ]]; then
    [[ $refused == unknown ]] && refused="(version unknown)"
    record NOTE "$SECONDS" "NVIDIA NCCL $refused refuses several ranks per GPU: no PyTorch-NCCL figure; the device-copy bound is the reference"
  fi
  return $failed
}

export -f kill_tagged record need_lib need_bins have_torch bench_exec bench_status figures perf_run \
  expect_path which_path windows_path free_port run_torch run_status \
  probe_stage build_stage perf_stage sweeps_stage torch_stage bench_stage

trap 'kill_tagged "SHOAL_CHECK_STAGE=$CURRENT_TAG"; exit 143' TERM INT

# Each stage's reserve keeps time for the wanted stages after it that need
# it most: the PyTorch stages (torch about 40 s, bench about 60 s).
reserve=0
wants torch && reserve=$((reserve + 40))
wants bench && reserve=$((reserve + 60))
stage probe 60 "$reserve" probe_stage
if wants probe && [[ -f $OUTDIR/probe.log ]]; then
  COPY_GBS=$(sed -n 's/^copy-gbs: //p' "$OUTDIR/probe.log" | tail -1)
  NV_NCCL=$(sed -n 's/^nccl-in-use: //p' "$OUTDIR/probe.log" | tail -1)
  if [[ $COPY_GBS =~ ^[0-9]+$ ]] && ((COPY_GBS > 0)); then
    note "  NOTE     device copy (1 GiB, read + write): B = $COPY_GBS GB/s; the bound B(N-1)/N^2: $((COPY_GBS / 4)) GB/s busbw at 2 ranks, $((COPY_GBS * 3 / 16)) at 4"
  else
    COPY_GBS=""
  fi
fi
stage build 240 "$reserve" build_stage
stage perf 150 "$reserve" perf_stage
reserve=0
wants bench && reserve=60
stage torch 90 "$reserve" torch_stage
stage bench 150 0 bench_stage
stage sweeps "$BUDGET_S" 0 sweeps_stage

echo "=== summary"
cat "$SUMMARY"
! grep -q '^FAIL' "$SUMMARY"
