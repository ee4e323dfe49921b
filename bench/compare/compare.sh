#!/usr/bin/env bash
# Shoal next to Open MPI and Gloo on local ranks, in one run: builds our peer
# programs (mpi_coll_bench.cc, gloo_coll_bench.cc, probe.c) into OUT/bin, runs
# every library on the same sizes and rank counts, interleaved (round 1: A B C
# ..., round 2: B C ... A, ...), with the contention probe before and after
# every round, then prints one table per (op, ranks) with medians and ratios
# and writes OUT/results.csv, OUT/table.md and OUT/busbw_<op>_np<N>.png.
# See bench/compare/README.md.
#
#   bench/compare/compare.sh [-o allreduce|allgather|reduce_scatter|all|LIST] [-n 2[,4]]
#       [-r REPEATS] [-b MIN] [-e MAX] [-f FACTOR] [--iters N] [--warmup N]
#       [--libs LIST] [--out DIR] [--quiet-wait S] [--quiet-us US] [--extra K] [--timeout S]
#       [--no-install] [--no-malloc-tune]
#
# Environment: SHOAL_BUILD (Shoal's CMake build folder; default <repo>/build,
# needs bench/perf/{all_reduce,all_gather,reduce_scatter}_perf built with MPI).
# Every byte stays on loopback; eth0 is never used.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SHOAL_BUILD=${SHOAL_BUILD:-$ROOT/build}
PY=/usr/bin/python3   # Debian's python3 (sees python3-matplotlib); the PATH one may not

OPS=allreduce; NPS=2; REPEATS=3; MINB=8; MAXB=64M; FACTOR=2; ITERS=20; WARMUP=5
LIBS=""; OUT=$ROOT/build/compare; QUIET_WAIT=10; QUIET_US=100; TIMEOUT=600; INSTALL=1; EXTRA=0
MALLOC_TUNE=1
usage() { sed -n '2,/^set -euo/p' "$0" | grep -v '^set' | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    -o) OPS=$2; shift 2 ;;
    -n) NPS=$2; shift 2 ;;
    -r) REPEATS=$2; shift 2 ;;
    -b) MINB=$2; shift 2 ;;
    -e) MAXB=$2; shift 2 ;;
    -f) FACTOR=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --libs) LIBS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --quiet-wait) QUIET_WAIT=$2; shift 2 ;;
    --quiet-us) QUIET_US=$2; shift 2 ;;
    --extra) EXTRA=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --no-malloc-tune) MALLOC_TUNE=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ "$OPS" = all ] && OPS=allreduce,allgather,reduce_scatter
IFS=, read -r -a OP_LIST <<<"$OPS"
IFS=, read -r -a NP_LIST <<<"$NPS"
((REPEATS >= 1)) || { echo "-r must be >= 1" >&2; exit 2; }
((REPEATS >= 3)) || echo "note: -r $REPEATS < 3; medians of fewer than 3 launches are not a fair comparison" >&2

log() { echo "[compare $(date +%H:%M:%S)] $*" >&2; }

# ---- dependencies ----------------------------------------------------------
need_pkgs=()
command -v mpicxx >/dev/null 2>&1 || need_pkgs+=(libopenmpi-dev openmpi-bin)
dpkg -s libgloo-dev >/dev/null 2>&1 || need_pkgs+=(libgloo-dev)
"$PY" -c 'import matplotlib' >/dev/null 2>&1 || need_pkgs+=(python3-matplotlib)
if ((${#need_pkgs[@]})); then
  if ((INSTALL)); then
    log "installing ${need_pkgs[*]}"
    apt-get install -y --no-install-recommends "${need_pkgs[@]}" >/dev/null ||
      { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${need_pkgs[@]}" >/dev/null; } ||
      log "apt-get failed; continuing without ${need_pkgs[*]}"
  else
    log "missing ${need_pkgs[*]} (--no-install): those parts are skipped"
  fi
fi
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found (openmpi-bin)" >&2; exit 1; }

PERF=$SHOAL_BUILD/bench/perf
for op in "${OP_LIST[@]}"; do
  case "$op" in
    allreduce) b=all_reduce_perf ;; allgather) b=all_gather_perf ;; reduce_scatter) b=reduce_scatter_perf ;;
    *) echo "unsupported op $op" >&2; exit 2 ;;
  esac
  [ -x "$PERF/$b" ] || { echo "$PERF/$b not found: build Shoal first (or set SHOAL_BUILD)" >&2; exit 1; }
done
ldd "$PERF/all_reduce_perf" 2>/dev/null | grep -q libmpi ||
  log "warning: $PERF/all_reduce_perf is not linked with MPI; under mpirun every process would be its own 1-rank world"

# ---- build the peer programs -----------------------------------------------
mkdir -p "$OUT/bin" "$OUT/raw"
rm -f "$OUT"/raw/* "$OUT"/busbw_*.png "$OUT"/results.csv "$OUT"/table.md   # results of an earlier run
BIN=$OUT/bin
build() {  # target, sources-that-it-depends-on..., -- command...
  local target=$1; shift
  local deps=() stale=0
  while [ "$1" != -- ]; do deps+=("$1"); shift; done; shift
  [ -x "$target" ] || stale=1
  for d in "${deps[@]}"; do if [ "$d" -nt "$target" ]; then stale=1; fi; done
  ((stale)) || return 0
  log "building $(basename "$target")"
  "$@"
}
build "$BIN/probe" "$HERE/probe.c" -- gcc -O2 -std=c11 -o "$BIN/probe" "$HERE/probe.c"
build "$BIN/mpi_coll_bench" "$HERE/mpi_coll_bench.cc" "$HERE/coll_common.h" -- \
  mpicxx -DOMPI_SKIP_MPICXX -O3 -std=c++17 -o "$BIN/mpi_coll_bench" "$HERE/mpi_coll_bench.cc"
HAVE_GLOO=0
if dpkg -s libgloo-dev >/dev/null 2>&1; then
  build "$BIN/gloo_coll_bench" "$HERE/gloo_coll_bench.cc" "$HERE/coll_common.h" -- \
    g++ -O3 -std=c++17 -o "$BIN/gloo_coll_bench" "$HERE/gloo_coll_bench.cc" -lgloo -lpthread && HAVE_GLOO=1
fi

# ---- launchers ---------------------------------------------------------------
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_SOCKET_IFNAME=lo GLOO_SOCKET_IFNAME=lo UCX_NET_DEVICES=lo
unset SHOAL_TRANSPORT NCCL_NET   # Shoal's default transport choice unless a line says otherwise
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none
        --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo -x NCCL_SOCKET_IFNAME=lo)
# Fresh pages are very expensive on this VM at times (`probe -F`: 0.2-0.3 GB/s,
# ~15 us per 4 KiB page, versus several GB/s on a normal host). Open MPI's
# large-message collectives malloc and free temporary buffers on every call,
# which glibc serves with mmap/munmap, so they fault their temporaries in again
# on every call and fall to ~0.2 GB/s at >= 32 MiB. Every line (Shoal too)
# therefore runs with glibc told to keep freed memory; --no-malloc-tune turns
# this off (then MPI's large sizes measure this VM's page faults).
if ((MALLOC_TUNE)); then
  MPIRUN+=(-x MALLOC_MMAP_THRESHOLD_=4294967296 -x MALLOC_TRIM_THRESHOLD_=68719476736)
fi
SWEEP=(-b "$MINB" -e "$MAXB" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -c 1)

DEFAULT_LIBS=(shoal_shm shoal_tcp mpi_vader mpi_tcp mpi_ucx gloo_ring gloo_hd)
# libfabric lines, on request with --libs: Shoal's ofi transport
# over shm and tcp;ofi_rxm, and Open MPI's ofi MTL over tcp;ofi_rxm (4.1's
# MTL does not start over shm: "init returned failure"; compare with mpi_vader).
OFI_LIBS=(shoal_ofi_shm shoal_ofi_tcp mpi_ofi_tcp)
ALL_LIBS=("${DEFAULT_LIBS[@]}" "${OFI_LIBS[@]}")
if [ -n "$LIBS" ]; then IFS=, read -r -a WANT <<<"$LIBS"; else WANT=("${DEFAULT_LIBS[@]}"); fi
libs_for() {  # op -> the libraries that have it
  local op=$1 l
  for l in "${WANT[@]}"; do
    case "$l" in
      gloo_ring) ((HAVE_GLOO)) && [ "$op" != reduce_scatter ] && echo "$l" ;;
      gloo_hd) ((HAVE_GLOO)) && [ "$op" != allgather ] && echo "$l" ;;
      shoal_shm|shoal_tcp|mpi_vader|mpi_tcp|mpi_ucx|shoal_ofi_shm|shoal_ofi_tcp|mpi_ofi_tcp) echo "$l" ;;
      *) log "unknown library $l (known: ${ALL_LIBS[*]})" ;;
    esac
  done
}
declare -A SKIP=()

ofi_provider() {  # shoal_ofi_shm | shoal_ofi_tcp -> libfabric provider
  case "$1" in *_shm) echo shm ;; *) echo 'tcp;ofi_rxm' ;; esac
}

launch() {  # lib op np csv-file -> runs one launch, output to stdout
  local lib=$1 op=$2 np=$3 csv=$4 shoalbin store rc
  case "$op" in
    allreduce) shoalbin=all_reduce_perf ;; allgather) shoalbin=all_gather_perf ;;
    reduce_scatter) shoalbin=reduce_scatter_perf ;;
  esac
  local M=("${MPIRUN[@]}" -np "$np")
  case "$lib" in
    # NCCL_DEBUG=INFO only logs at init here; it shows which transport each channel took.
    shoal_shm) timeout "$TIMEOUT" "${M[@]}" -x NCCL_DEBUG=INFO "$PERF/$shoalbin" "${SWEEP[@]}" --csv "$csv" ;;
    shoal_tcp) timeout "$TIMEOUT" "${M[@]}" -x NCCL_DEBUG=INFO -x SHOAL_TRANSPORT=tcp \
                 "$PERF/$shoalbin" "${SWEEP[@]}" --csv "$csv" ;;
    shoal_ofi_shm|shoal_ofi_tcp)
      timeout "$TIMEOUT" "${M[@]}" -x NCCL_DEBUG=INFO -x SHOAL_TRANSPORT=ofi -x FI_PROVIDER="$(ofi_provider "$lib")" \
        "$PERF/$shoalbin" "${SWEEP[@]}" --csv "$csv" ;;
    mpi_ofi_tcp)
      timeout "$TIMEOUT" "${M[@]}" --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include 'tcp;ofi_rxm' \
        -x FI_PROVIDER='tcp;ofi_rxm' "$BIN/mpi_coll_bench" -o "$op" "${SWEEP[@]}" --csv "$csv" ;;
    mpi_vader) timeout "$TIMEOUT" "${M[@]}" --mca pml ob1 --mca btl vader,self \
                 "$BIN/mpi_coll_bench" -o "$op" "${SWEEP[@]}" --csv "$csv" ;;
    mpi_tcp) timeout "$TIMEOUT" "${M[@]}" --mca pml ob1 --mca btl tcp,self \
               "$BIN/mpi_coll_bench" -o "$op" "${SWEEP[@]}" --csv "$csv" ;;
    mpi_ucx) timeout "$TIMEOUT" "${M[@]}" --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any \
               -x UCX_NET_DEVICES=lo "$BIN/mpi_coll_bench" -o "$op" "${SWEEP[@]}" --csv "$csv" ;;
    gloo_ring|gloo_hd)
      store=$(mktemp -d /tmp/shoal-compare-store.XXXXXX)   # FileStore rendezvous, fresh per launch
      rc=0
      timeout "$TIMEOUT" "${M[@]}" -x GLOO_SOCKET_IFNAME=lo "$BIN/gloo_coll_bench" -o "$op" \
        -A "${lib#gloo_}" --store "$store" "${SWEEP[@]}" --csv "$csv" || rc=$?
      rm -rf "$store"
      return $rc ;;
  esac
}

probe() {  # -> one-way us (median), or 0 if the probe failed
  local line
  line=$("$BIN/probe" -s 1048576 -n 300 -r 3 2>/dev/null) || { echo 0; return; }
  echo "$line" >>"$OUT/probe.log"
  awk '{for (i = 1; i <= NF; i++) if ($i == "median") print $(i + 1)}' <<<"$line"
}
quiet_wait() {  # waits up to QUIET_WAIT s for the probe to read < QUIET_US; prints the last reading
  local us waited=0
  us=$(probe)
  while awk -v u="$us" -v q="$QUIET_US" 'BEGIN { exit !(u >= q) }' && ((waited < QUIET_WAIT)); do
    sleep 2; waited=$((waited + 2)); us=$(probe)
  done
  echo "$us"
}

# ---- interleaved rounds ----------------------------------------------------
: >"$OUT/probe.log"
echo "op,nranks,round,library,launch_rc,probe_before_us,probe_after_us,contended,load1,fault_gbps,finished" >"$OUT/rounds.csv"
{
  echo "# compare.sh $(date -Is) host $(hostname) nproc $(nproc)"
  echo "# ops=$OPS nps=$NPS repeats=$REPEATS sizes=$MINB..$MAXB factor=$FACTOR iters=$ITERS warmup=$WARMUP malloc_tune=$MALLOC_TUNE"
  echo "# shoal=$PERF ($(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?'))"
  echo "# $(mpirun --version 2>/dev/null | head -1); gloo $(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null || echo none)"
} >"$OUT/meta.txt"
declare -A CLEAN=()   # "op np" -> rounds the probe did not flag
round() {  # op np rep
  local op=$1 np=$2 rep=$3 libs nl k lib tag rc want before after load contended r fault results=()
  mapfile -t libs < <(libs_for "$op")
  nl=${#libs[@]}
  before=$(quiet_wait)
  load=$(cut -d' ' -f1 /proc/loadavg)
  fault=$("$BIN/probe" -F 2>/dev/null | tee -a "$OUT/probe.log" | awk '{print $7}') || fault=
  log "round $rep $op np=$np: probe ${before} us, load $load, fresh pages ${fault:-?} GB/s"
  for ((k = 0; k < nl; k++)); do
    lib=${libs[$(((k + rep - 1) % nl))]}   # rotate the order every round
    if [ -n "${SKIP[$lib]:-}" ]; then continue; fi
    tag=${op}_np${np}_r${rep}_${lib}
    rc=0
    launch "$lib" "$op" "$np" "$OUT/raw/$tag.csv" >"$OUT/raw/$tag.txt" 2>&1 || rc=$?
    if ((rc != 0)) || [ ! -s "$OUT/raw/$tag.csv" ]; then
      log "  $lib failed (rc=$rc; see raw/$tag.txt)"
      if [ "$lib" = mpi_ucx ]; then SKIP[$lib]=1; log "  mpi_ucx skipped from now on"; fi
    fi
    case "$lib" in
      shoal_shm|shoal_tcp|shoal_ofi_*)
        want=${lib#shoal_}; want=${want%_*}
        if grep -q ' via ' "$OUT/raw/$tag.txt" && grep ' via ' "$OUT/raw/$tag.txt" | grep -qv " via $want"; then
          log "  warning: $lib used another transport than $want: $(grep -o ' via [a-z]*' "$OUT/raw/$tag.txt" | sort | uniq -c | tr -s ' \n' ' ')"
        fi ;;
    esac
    results+=("$lib:$rc")
  done
  after=$(probe)
  contended=0
  if awk -v a="$before" -v b="$after" -v q="$QUIET_US" 'BEGIN { exit !(a >= q || b >= q) }'; then
    contended=1
    log "  round marked contended (probe ${before} / ${after} us >= $QUIET_US)"
  else
    CLEAN["$op $np"]=$((${CLEAN["$op $np"]:-0} + 1))
  fi
  for r in "${results[@]}"; do
    echo "$op,$np,$rep,${r%%:*},${r##*:},$before,$after,$contended,$load,$fault,$(date -Is)" >>"$OUT/rounds.csv"
  done
}

t_start=$(date +%s)
for ((rep = 1; rep <= REPEATS; rep++)); do
  for op in "${OP_LIST[@]}"; do
    for np in "${NP_LIST[@]}"; do round "$op" "$np" "$rep"; done
  done
done
# Up to --extra more rounds where contention left fewer than -r clean rounds.
for op in "${OP_LIST[@]}"; do
  for np in "${NP_LIST[@]}"; do
    rep=$REPEATS
    while ((${CLEAN["$op $np"]:-0} < REPEATS && rep < REPEATS + EXTRA)); do
      rep=$((rep + 1))
      log "extra round for $op np=$np (${CLEAN["$op $np"]:-0} clean of $REPEATS so far)"
      round "$op" "$np" "$rep"
    done
  done
done
log "runs took $(($(date +%s) - t_start)) s"

"$PY" "$HERE/compare.py" "$OUT"
