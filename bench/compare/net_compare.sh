#!/usr/bin/env bash
# Shoal next to Open MPI across emulated nodes (tests/netns/cluster.sh), over
# TCP sockets and over libfabric (tcp;ofi_rxm), side by side in one run.
#
#   net_compare.sh [--nodes N] [--ranks-per-node L] [--rounds R] [--rate RATE]
#                  [-o all_reduce,all_gather,reduce_scatter] [-b MIN] [-e MAX] [-f F]
#                  [-n ITERS] [-w WARMUP] [--lines shoal_tcp,shoal_ofi,mpi_tcp,mpi_ofi,gloo]
#                  [--out FILE]
#   net_compare.sh --report FILE     the tables again, from the raw lines of a run
#
# Defaults: 2 nodes x 1 rank, 3 rounds, unlimited veth, every op, the four
# Shoal and Open MPI lines,
# -b 16 -e 64M -f 4 -n 20 -w 5 (sizes take K/M/G suffixes).
# Lines (every one with MALLOC_MMAP_THRESHOLD_=4294967296
# MALLOC_TRIM_THRESHOLD_=68719476736 in its ranks, as compare.sh):
#   shoal_tcp  build/bench/perf/<op>_perf -c 0, NCCL_NET=Socket
#   shoal_ofi  the same with NCCL_NET=Libfabric FI_PROVIDER='tcp;ofi_rxm'
#   mpi_tcp    mpi_coll_bench (built into build/compare/bin), cluster.sh's
#              --mca pml ob1 --mca btl self,vader,tcp
#   mpi_ofi    mpi_coll_bench with --mca pml cm --mca mtl ofi
#              --mca mtl_ofi_provider_exclude none, FI_PROVIDER='tcp;ofi_rxm'
#              (pml cm fails to start unless the ofi MTL opens that provider)
#   gloo       gloo_coll_bench (built into build/compare/bin; libgloo-dev is
#              installed with apt-get when missing) over Gloo's tcp device on the node's link
#              (cluster.sh sets GLOO_SOCKET_IFNAME), FileStore rendezvous in
#              a fresh folder per launch; AllReduce and
#              AllGather by Gloo's ring, ReduceScatter by halving-doubling.
#              Gloo's ring AllReduce and its ReduceScatter are in place: their
#              in-place columns stand in for the out-of-place ones.
# With more ranks than CPUs the MPI lines get --mca mpi_yield_when_idle 1, as
# Open MPI picks on an oversubscribed host: cluster.sh's hostfile gives each
# node L slots, so it would spin (2x2 ranks on 2 CPUs: ~8 ms per call, not 60 us).
# Each round runs every op, and for each op every line once, one launch each,
# in an order rotated by one per round. --out FILE (default a new
# /tmp/net_compare.XXXXXX.txt; an existing FILE is overwritten) gets a header
# and, per launch, "op line round" followed by each table row of rank 0; at the
# end, per op, the median out-of-place busbw (GB/s) of every line and size
# [time us up to 64 KiB] and the ratios Shoal ofi / MPI ofi, Shoal ofi /
# Shoal tcp, Shoal tcp / MPI tcp and Shoal tcp / Gloo (on the median launch's time; > 1: the
# first is faster). SHOAL_PERF_DIR overrides build/bench/perf.
set -eu
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
NODES=2 RPN=1 ROUNDS=3 RATE="" OPS=all_reduce,all_gather,reduce_scatter
MIN=16 MAX=64M FACTOR=4 ITERS=20 WARMUP=5 LINES=shoal_tcp,shoal_ofi,mpi_tcp,mpi_ofi OUT="" REPORT=""
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) NODES=$2; shift 2 ;;
    --ranks-per-node) RPN=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    -o) OPS=$2; shift 2 ;;
    -b) MIN=$2; shift 2 ;;
    -e) MAX=$2; shift 2 ;;
    -f) FACTOR=$2; shift 2 ;;
    -n) ITERS=$2; shift 2 ;;
    -w) WARMUP=$2; shift 2 ;;
    --lines) LINES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --report) REPORT=$2; shift 2 ;;
    *) sed -n '2,/^set -eu/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
report() {  # FILE -> the tables
  python3 - "$1" <<'PY'
import collections, sys
runs = collections.defaultdict(list)  # (op, size, line) -> [(time_us, busbw)]
ranks = "?"
for row in open(sys.argv[1]):
    f = row.split()
    if row.startswith("#"):
        ranks = next((w[6:] for w in f if w.startswith("ranks=")), ranks)
        continue
    if len(f) < 11:
        continue
    op, line, size, t, bw = f[0], f[1], int(f[3]), f[8], f[10]
    if line == "gloo" and t == "N/A" and len(f) >= 15:  # Gloo's in-place-only algorithms
        t, bw = f[12], f[14]
    try:
        runs[(op, size, line)].append((float(t), float(bw)))
    except ValueError:  # N/A
        pass
ORDER = ["shoal_tcp", "shoal_ofi", "mpi_tcp", "mpi_ofi", "gloo"]
LABEL = {"shoal_tcp": "Shoal tcp", "shoal_ofi": "Shoal ofi", "mpi_tcp": "MPI tcp", "mpi_ofi": "MPI ofi",
         "gloo": "Gloo"}
RATIOS = [("shoal_ofi", "mpi_ofi"), ("shoal_ofi", "shoal_tcp"), ("shoal_tcp", "mpi_tcp"), ("shoal_tcp", "gloo")]

def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024

def median(v):  # the median launch by time (for an even count the faster of the middle two)
    v = sorted(v)
    return v[(len(v) - 1) // 2]

for op in [o for o in ("all_reduce", "all_gather", "reduce_scatter") if any(k[0] == o for k in runs)]:
    lines = [l for l in ORDER if any(k[0] == op and k[2] == l for k in runs)]
    ratios = [(a, b) for a, b in RATIOS if a in lines and b in lines]
    n = max(len(v) for k, v in runs.items() if k[0] == op)
    print(f"\n### {op}, {ranks} ranks: busbw GB/s (out of place), median of {n} launches "
          "[time us up to 64 KiB]; ratios on the median launch's time, > 1: the first is faster\n")
    head = ["size"] + [LABEL[l] for l in lines] + [f"{LABEL[a]} / {LABEL[b]}" for a, b in ratios]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for size in sorted({k[1] for k in runs if k[0] == op and k[1] > 0}):
        med = {l: median(runs[(op, size, l)]) for l in lines if runs.get((op, size, l))}
        cells = [human(size)]
        for l in lines:
            if l not in med:
                cells.append("-")
                continue
            t, bw = med[l]
            cells.append(f"{bw:.2f}" + (f" [{t:.1f}]" if size <= 65536 else ""))
        for a, b in ratios:
            cells.append(f"{med[b][0] / med[a][0]:.2f}" if a in med and b in med and med[a][0] > 0 else "-")
        print("| " + " | ".join(cells) + " |")
    if "gloo" in lines and op in ("all_reduce", "reduce_scatter"):
        print("\nGloo's column: its in-place run (its ring AllReduce and its ReduceScatter are in place).")
PY
}
if [ -n "$REPORT" ]; then report "$REPORT"; exit 0; fi

IFS=, read -r -a OP_LIST <<<"$OPS"
IFS=, read -r -a LINE_LIST <<<"$LINES"
for op in "${OP_LIST[@]}"; do
  case $op in all_reduce|all_gather|reduce_scatter) ;; *) echo "unknown op $op" >&2; exit 2 ;; esac
done
for line in "${LINE_LIST[@]}"; do
  case $line in shoal_tcp|shoal_ofi|mpi_tcp|mpi_ofi|gloo) ;; *) echo "unknown line $line" >&2; exit 2 ;; esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "--rounds must be a positive integer" >&2; exit 2; }
[ "$ROUNDS" -ge 3 ] || echo "note: --rounds $ROUNDS < 3; medians of fewer than 3 launches are not a fair comparison" >&2

PERF=${SHOAL_PERF_DIR:-$ROOT/build/bench/perf}
for op in "${OP_LIST[@]}"; do
  [ -x "$PERF/${op}_perf" ] || { echo "$PERF/${op}_perf not found: build Shoal first" >&2; exit 1; }
done
BIN=$ROOT/build/compare/bin
# build_peer NAME COMPILER [FLAGS...] [-- LIBS...]: builds $BIN/NAME from
# $HERE/NAME.cc when missing or older than its source or coll_common.h.
build_peer() {
  local name=$1 target=$BIN/$1 compile=() libs=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do compile+=("$1"); shift; done
  [ $# -gt 0 ] && shift && libs=("$@")
  if [ ! -x "$target" ] || [ "$HERE/$name.cc" -nt "$target" ] || [ "$HERE/coll_common.h" -nt "$target" ]; then
    echo "building $target" >&2
    mkdir -p "$BIN"
    "${compile[@]}" -O3 -std=c++17 -o "$target" "$HERE/$name.cc" "${libs[@]}"
  fi
}
MPIBENCH=$BIN/mpi_coll_bench
[[ ,$LINES, == *,mpi_* ]] && build_peer mpi_coll_bench mpicxx -DOMPI_SKIP_MPICXX
GLOOBENCH=$BIN/gloo_coll_bench
if [[ ,$LINES, == *,gloo,* ]]; then
  # As compare.sh: install the peer's package when it is missing.
  dpkg -s libgloo-dev >/dev/null 2>&1 ||
    apt-get install -y --no-install-recommends libgloo-dev >/dev/null 2>&1 ||
    { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends libgloo-dev >/dev/null 2>&1; } ||
    { echo "the gloo line needs libgloo-dev, and apt-get could not install it" >&2; exit 1; }
  build_peer gloo_coll_bench g++ -- -lgloo -lpthread
fi
OUT=${OUT:-$(mktemp /tmp/net_compare.XXXXXX.txt)}
LOG=$(mktemp /tmp/net_compare.launch.XXXXXX)
STORE=$(mktemp -d /tmp/net_compare.gloo.XXXXXX)
trap 'rm -rf "$LOG" "$STORE"' EXIT
CLUSTER=(bash "$ROOT/tests/netns/cluster.sh" --nodes "$NODES" --ranks-per-node "$RPN")
[ -n "$RATE" ] && CLUSTER+=(--rate "$RATE")
SWEEP=(-b "$MIN" -e "$MAX" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -c 0)
MALLOC=(env MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736)
MPI_MCA=()
[ $((NODES * RPN)) -gt "$(nproc)" ] && MPI_MCA=(--mca mpi_yield_when_idle 1)
# Each line sets its own network; the caller's choice must not leak into the others.
unset NCCL_NET SHOAL_TRANSPORT FI_PROVIDER

launch() {  # line op -> one launch through cluster.sh, its output on stdout
  local line=$1 op=$2 mpiop
  case $op in all_reduce) mpiop=allreduce ;; all_gather) mpiop=allgather ;; *) mpiop=$op ;; esac
  case $line in
    shoal_tcp) env NCCL_DEBUG=INFO NCCL_NET=Socket "${CLUSTER[@]}" -- \
                 "${MALLOC[@]}" "$PERF/${op}_perf" "${SWEEP[@]}" ;;
    shoal_ofi) env NCCL_DEBUG=INFO NCCL_NET=Libfabric FI_PROVIDER='tcp;ofi_rxm' "${CLUSTER[@]}" -- \
                 "${MALLOC[@]}" "$PERF/${op}_perf" "${SWEEP[@]}" ;;
    mpi_tcp) "${CLUSTER[@]}" "${MPI_MCA[@]}" -- "${MALLOC[@]}" "$MPIBENCH" -o "$mpiop" "${SWEEP[@]}" ;;
    mpi_ofi) env FI_PROVIDER='tcp;ofi_rxm' "${CLUSTER[@]}" "${MPI_MCA[@]}" \
               --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_exclude none -- \
               "${MALLOC[@]}" "$MPIBENCH" -o "$mpiop" "${SWEEP[@]}" ;;
    gloo) local algo=ring store
          [ "$op" = reduce_scatter ] && algo=hd
          store=$(mktemp -d "$STORE/launch.XXXXXX")   # a fresh rendezvous per launch
          "${CLUSTER[@]}" -- "${MALLOC[@]}" \
            "$GLOOBENCH" -o "$mpiop" -A "$algo" --store "$store" "${SWEEP[@]}" ;;
  esac
}

{
  echo "# net_compare.sh $(date -Is) host $(hostname) nproc $(nproc)"
  echo "# nodes=$NODES rpn=$RPN ranks=$((NODES * RPN)) rounds=$ROUNDS rate=${RATE:-none} ops=$OPS lines=$LINES sizes=$MIN..$MAX factor=$FACTOR iters=$ITERS warmup=$WARMUP"
  echo "# mpi extra: ${MPI_MCA[*]:-none}"
  echo "# shoal=$PERF ($(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')); $(mpirun --version 2>/dev/null | head -1)"
  echo "# columns: op line round, then the row: size count type redop root time algbw busbw #wrong (out of place) and in place"
} >"$OUT"
FAILED=0
NL=${#LINE_LIST[@]}
for round in $(seq "$ROUNDS"); do
  for op in "${OP_LIST[@]}"; do
    for ((k = 0; k < NL; k++)); do
      line=${LINE_LIST[$(((k + round - 1) % NL))]}   # rotated by one per round
      echo "round $round $op $line" >&2
      rc=0
      launch "$line" "$op" >"$LOG" 2>&1 || rc=$?
      awk -v op="$op" -v l="$line" -v r="$round" '/^ +[0-9]/ {print op, l, r, $0}' "$LOG" >>"$OUT"
      if [ "$rc" != 0 ] || ! grep -qE '^ +[0-9]' "$LOG"; then
        FAILED=$((FAILED + 1))
        echo "  $line $op round $round failed (rc=$rc); its last lines:" >&2
        tail -n 15 "$LOG" | sed 's/^/    /' >&2
      fi
      case $line in
        shoal_*)   # channels between nodes must use the line's transport (shm within a node)
          want=${line#shoal_}
          if grep ' via ' "$LOG" | grep -qvE " via ($want|shm)\$"; then
            echo "  warning: $line used another transport than $want: $(grep -o ' via [a-z]*' "$LOG" | sort | uniq -c | tr -s ' \n' ' ')" >&2
          fi ;;
      esac
    done
  done
done

echo "raw: $OUT"
report "$OUT"
[ "$FAILED" = 0 ] || { echo "$FAILED launch(es) failed" >&2; exit 1; }
