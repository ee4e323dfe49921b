#!/usr/bin/env bash
# Runs an AllReduce across 2 emulated nodes whose links tbf limits to RATE
# (Mbit/s) and checks the measured bus bandwidth is bounded by it: the limit
# must hold (no more than 1.25x the rate: tbf's burst), and the run must
# reach at least a quarter of it (it moved data over those links).
#   check_rate.sh CLUSTER_SH ALL_REDUCE_PERF RATE_MBIT
set -uo pipefail
cluster=$1 perf=$2 rate=$3
out=$(bash "$cluster" --nodes 2 --ranks-per-node 1 --rate "${rate}mbit" --timeout 55 \
  -- "$perf" -b 4M -e 4M -c 1 -n 3 -w 1 2>&1)
rc=$?
echo "$out"
((rc == 0)) || exit "$rc"
# The 4 MiB row: size count type redop root time algbw busbw #wrong ...
busbw=$(awk '$1 == 4194304 { print $8; exit }' <<<"$out")
[ -n "$busbw" ] || { echo "check_rate.sh: no 4 MiB row"; exit 1; }
limit=$(awk -v r="$rate" 'BEGIN { print r / 8 / 1000 }')  # GB/s
awk -v b="$busbw" -v l="$limit" 'BEGIN {
  printf "check_rate.sh: busbw %.4f GB/s, link limit %.4f GB/s\n", b, l;
  exit !(b <= 1.25 * l && b >= 0.25 * l) }' || { echo "check_rate.sh: FAILED: busbw outside [0.25, 1.25] x the limit"; exit 1; }
