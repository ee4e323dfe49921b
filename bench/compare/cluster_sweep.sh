#!/usr/bin/env bash
# Interleaved sweep of Shoal's algorithms across emulated nodes
# (tests/netns/cluster.sh): the flat ring, the latency algorithm,
# hierarchical and the tuner's pick side by side.
#
#   cluster_sweep.sh [--nodes N] [--ranks-per-node L] [--rounds R] [--rate RATE]
#                    [-b MIN] [-e MAX] [-n ITERS] [-w WARMUP] [-o OUT.txt]
#
# For each round, op (AllReduce, AllGather, ReduceScatter) and algorithm
# (ring, the op's latency algorithm, hierarchical, and "tuner" = SHOAL_ALGO
# unset) it runs one benchmark and appends "op algo round bytes us_out
# us_in" lines to OUT; at the end it prints, per op, the median time of every
# algorithm at every size.
set -eu
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
NODES=2 RPN=2 ROUNDS=3 RATE="" MIN=8 MAX=256K ITERS=200 WARMUP=20 OUT=""
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) NODES=$2; shift 2 ;;
    --ranks-per-node) RPN=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    -b) MIN=$2; shift 2 ;;
    -e) MAX=$2; shift 2 ;;
    -n) ITERS=$2; shift 2 ;;
    -w) WARMUP=$2; shift 2 ;;
    -o) OUT=$2; shift 2 ;;
    *) sed -n '2,/^set -eu/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
PERF=${SHOAL_PERF_DIR:-$ROOT/build/bench/perf}
OUT=${OUT:-$(mktemp /tmp/cluster_sweep.XXXXXX.txt)}
RATE_ARGS=()
[ -n "$RATE" ] && RATE_ARGS=(--rate "$RATE")

for round in $(seq "$ROUNDS"); do
  for op in all_reduce all_gather reduce_scatter; do
    latency=bruck
    [ $op = all_reduce ] && latency=recursive_doubling
    for algo in ring $latency hierarchical tuner; do
      if [ $algo = tuner ]; then unset SHOAL_ALGO; else export SHOAL_ALGO=$algo; fi
      bash "$ROOT/tests/netns/cluster.sh" --nodes "$NODES" --ranks-per-node "$RPN" "${RATE_ARGS[@]}" -- \
        "$PERF/${op}_perf" -b "$MIN" -e "$MAX" -f 4 -c 0 -n "$ITERS" -w "$WARMUP" 2>&1 |
        awk -v op=$op -v a=$algo -v r=$round '/^ +[0-9]/ {print op, a, r, $1, $6, $10}' >>"$OUT"
    done
  done
done

echo "raw: $OUT"
python3 - "$OUT" <<'PY'
import collections, statistics, sys
times = collections.defaultdict(list)
for line in open(sys.argv[1]):
    op, algo, _, size, t_out, t_in = line.split()
    times[(op, int(size), algo)] += [float(t_out), float(t_in)]
for op in sorted({k[0] for k in times}):
    algos = list(dict.fromkeys(k[2] for k in times if k[0] == op))
    print(f"## {op}: median us per operation (in and out of place, all rounds)")
    print("bytes".rjust(10), *(a.rjust(19) for a in algos))
    for size in sorted({k[1] for k in times if k[0] == op and k[1] > 0}):
        print(str(size).rjust(10), *(f"{statistics.median(times[(op, size, a)]):19.1f}"
                                    if (op, size, a) in times else " " * 19 for a in algos))
PY
