#!/usr/bin/env bash
# Multi-rail check: runs COMMAND through cluster.sh with --rails R and
# requires every rail of every node to carry at least MIN_SHARE percent of
# that node's bytes sent (channels striped over the rails), besides COMMAND
# succeeding. Exit 77 (skip) where namespaces cannot be made.
#   check_rails.sh CLUSTER_SH MIN_SHARE --nodes N --ranks-per-node L --rails R -- COMMAND...
set -u
CLUSTER=$1 MIN_SHARE=$2
shift 2
out=$(bash "$CLUSTER" "$@" 2>&1)
rc=$?
echo "$out"
[ "$rc" = 77 ] && exit 77
if echo "$out" | grep -q 'network namespaces not used'; then
  echo "check_rails: no namespaces here, so no rails to check"
  exit 77
fi
[ "$rc" = 0 ] || { echo "check_rails: COMMAND failed (status $rc)"; exit 1; }
# Rows "nodeK ethJ tx rx" of the harness's table.
echo "$out" | awk -v min="$MIN_SHARE" '
  $1 ~ /^node[0-9]+$/ && $2 ~ /^eth[0-9]+$/ { tx[$1, $2] = $3; total[$1] += $3; rails[$2] = 1; nodes[$1] = 1 }
  END {
    n = 0; bad = 0
    for (node in nodes) for (rail in rails) {
      n++
      share = total[node] > 0 ? 100 * tx[node, rail] / total[node] : 0
      printf "check_rails: %s %s carried %.1f%% of the node'"'"'s bytes sent\n", node, rail, share
      if (share < min) bad++
    }
    if (n == 0) { print "check_rails: no per-rail byte table in the output"; exit 1 }
    if (bad) { printf "check_rails: %d rail(s) below %s%%\n", bad, min; exit 1 }
  }'
