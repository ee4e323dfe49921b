#!/usr/bin/env bash
# examples/elastic_train across real emulated nodes: three network namespaces
# (node0, node1, node2) joined by veth pairs to a bridge, as cluster.sh makes
# them, with each rank process of the trainer inside its node's namespace
# (elastic_train --netns-prefix). mpirun cannot do this run: node 1's ranks
# are SIGKILLed mid-step and two new processes start on node2 later, so the
# trainer stays its own launcher and only its ranks enter the namespaces.
#
#   elastic_netns.sh [--timeout S] [--min-bytes B] -- path/to/elastic_train [ARGS]
#   elastic_netns.sh --check-cleanup [--timeout S] -- path/to/elastic_train [ARGS]
#   elastic_netns.sh --cleanup-stale     remove namespaces of dead runs
#
# Layout (P = this script's pid; the root namespace gains nothing):
#   namespace shoal-elastic-P-sw  bridge br0 10.77.0.254/24, ports n0 n1 n2
#   namespace shoal-elastic-P-nK  lo, eth1 10.77.0.(K+1)/24 (veth peer of nK)
# The ranks get NCCL_SOCKET_IFNAME=eth1 and FI_TCP_IFACE=eth1 (the caller's
# values are ignored: inside a node only lo and eth1 exist) and
# NCCL_HOSTID=node<K> from the trainer.
#
# After the run it prints the bytes each node's eth1 sent and received, and
# fails unless the trainer exited 0 and every node's link carried at least
# --min-bytes (default 65536) each way: node 1 and node 2 have no other path
# to node 0, so that proves the run crossed the links. Exit 77 (skip) where
# namespaces cannot be made and SHOAL_NETNS_ALLOW_LOOPBACK=1 (the loopback
# run is the ctest examples.elastic_train); 2 there otherwise, and for bad
# arguments; 124 when --timeout (default 50 s) ended the trainer.
#
# --check-cleanup runs the whole test once, then once more ended by SIGTERM
# while the ranks train, and fails if either left a namespace behind or
# changed the root namespace's interfaces, or left its run folder
# (/tmp/shoal-elastic-P.XXXXXX, the trainer's TMPDIR) behind.
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF=$HERE/$(basename "${BASH_SOURCE[0]}")
PREFIX=shoal-elastic-$$
SUBNET=10.77.0
NODES=3
SKIP=77

die() { echo "elastic_netns.sh: $*" >&2; exit 2; }
say() { echo "elastic_netns.sh: $*"; }

our_namespaces() {  # [pid] -> this script's namespaces (of run pid, or all)
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^shoal-elastic-${1:-[0-9]+}-(sw|n[0-9]+)\$"
}

# Kills what still runs inside a namespace (the ranks), then deletes it; its
# veth ends and the bridge go with it.
remove_namespace() {
  local ns=$1 pids
  pids=$(ip netns pids "$ns" 2>/dev/null)
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
    for _ in $(seq 20); do
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  ip netns del "$ns" 2>/dev/null
}

TIMEOUT=50; MIN_BYTES=65536; CHECK_CLEANUP=0
while [ $# -gt 0 ]; do
  case $1 in
    --timeout) TIMEOUT=${2:-}; shift 2 ;;
    --min-bytes) MIN_BYTES=${2:-}; shift 2 ;;
    --check-cleanup) CHECK_CLEANUP=1; shift ;;
    --cleanup-stale)
      for ns in $(our_namespaces); do
        pid=${ns#shoal-elastic-}; pid=${pid%%-*}
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'elastic_netns\.sh' ||
          { remove_namespace "$ns"; echo "removed $ns"; }
      done
      for dir in /tmp/shoal-elastic-[0-9]*.??????; do
        [ -d "$dir" ] || continue
        pid=${dir#/tmp/shoal-elastic-}; pid=${pid%%.*}
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'elastic_netns\.sh' ||
          { rm -rf "$dir"; echo "removed $dir"; }
      done
      exit 0 ;;
    --) shift; break ;;
    *) die "unknown argument '$1'" ;;
  esac
done
[ $# -gt 0 ] || die "no trainer after '--'"
[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "--timeout must be whole seconds"
[[ $MIN_BYTES =~ ^[0-9]+$ ]] || die "--min-bytes must be a number of bytes"

if [ "$CHECK_CLEANUP" = 1 ]; then
  links_before=$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sort)
  fail=0
  # 1. A whole run.
  "$SELF" --timeout "$TIMEOUT" --min-bytes "$MIN_BYTES" -- "$@" &
  pid=$!; wait "$pid"; rc=$?
  [ "$rc" = 0 ] || fail=1
  left=$(our_namespaces "$pid"; ls -d "/tmp/shoal-elastic-$pid".* 2>/dev/null)
  if [ -z "$left" ]; then say "cleanup after the run (status $rc): nothing left"
  else say "cleanup after the run: LEFT BEHIND: $left"; fail=1; fi
  [ "$rc" = $SKIP ] && exit $SKIP
  # 2. SIGTERM while the ranks train (both of node 0's are in its namespace).
  set -m
  "$SELF" --timeout "$TIMEOUT" --min-bytes "$MIN_BYTES" -- "$@" >/dev/null 2>&1 &
  pid=$!; n=0
  for _ in $(seq 200); do
    n=$(ip netns pids "shoal-elastic-$pid-n0" 2>/dev/null | wc -l)
    [ "$n" -ge 2 ] && break
    sleep 0.05
  done
  [ "$n" -ge 2 ] || { say "SIGTERM check: node 0's ranks never started"; fail=1; }
  kill -TERM "$pid"; wait "$pid"; rc=$?
  [ "$rc" = 143 ] || { say "SIGTERM check: status $rc, not 143"; fail=1; }
  left=$(our_namespaces "$pid"; ls -d "/tmp/shoal-elastic-$pid".* 2>/dev/null)
  if [ -z "$left" ]; then say "cleanup after SIGTERM mid-run (status $rc): nothing left"
  else say "cleanup after SIGTERM mid-run: LEFT BEHIND: $left"; fail=1; fi
  links_after=$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sort)
  [ "$links_before" = "$links_after" ] ||
    { say "the root namespace's interfaces changed"; diff <(echo "$links_before") <(echo "$links_after"); fail=1; }
  if [ "$fail" = 0 ]; then say "PASS"; else say "FAIL"; fi
  exit "$fail"
fi


SW=$PREFIX-sw
MADE=()
JOB_PID=""
RUNDIR=""   # the trainer's TMPDIR (its id files), removed on exit
cleanup() {
  local rc=$? ns
  trap - EXIT INT TERM HUP
  if [ -n "$JOB_PID" ] && kill -0 "$JOB_PID" 2>/dev/null; then
    kill -TERM "$JOB_PID" 2>/dev/null    # timeout passes it on to the launcher
    for _ in $(seq 20); do kill -0 "$JOB_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$JOB_PID" 2>/dev/null
    wait "$JOB_PID" 2>/dev/null
  fi
  for ns in "${MADE[@]}"; do remove_namespace "$ns"; done
  [ -n "$RUNDIR" ] && rm -rf "$RUNDIR"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

make_namespaces() {  # -> 0, or 1 with WHY set
  local k err
  command -v ip >/dev/null 2>&1 || { WHY="iproute2 ('ip') is not installed"; return 1; }
  err=$(ip netns add "$SW" 2>&1) || { WHY="cannot create network namespaces ($err)"; return 1; }
  MADE+=("$SW")
  ip -n "$SW" link set lo up &&
    ip -n "$SW" link add br0 type bridge &&
    ip -n "$SW" addr add "$SUBNET.254/24" dev br0 &&
    ip -n "$SW" link set br0 up || { WHY="cannot set up the bridge"; return 1; }
  for ((k = 0; k < NODES; k++)); do
    ip netns add "$PREFIX-n$k" || { WHY="cannot create node $k's namespace"; return 1; }
    MADE+=("$PREFIX-n$k")
    # Both veth ends are made inside their namespaces: the root namespace
    # never sees them.
    ip -n "$PREFIX-n$k" link set lo up &&
      ip link add eth1 netns "$PREFIX-n$k" type veth peer name "n$k" netns "$SW" &&
      ip -n "$SW" link set "n$k" master br0 &&
      ip -n "$SW" link set "n$k" up &&
      ip -n "$PREFIX-n$k" addr add "$SUBNET.$((k + 1))/24" dev eth1 &&
      ip -n "$PREFIX-n$k" link set eth1 up || { WHY="cannot set up node $k's link"; return 1; }
  done
}

RUNDIR=$(mktemp -d "/tmp/$PREFIX.XXXXXX") || die "mktemp failed"
if ! make_namespaces; then
  if [ "${SHOAL_NETNS_ALLOW_LOOPBACK:-0}" = 1 ]; then
    say "network namespaces not used: $WHY: skipped (examples.elastic_train is the loopback run)"
    exit $SKIP
  fi
  die "network namespaces not used: $WHY"
fi

counters() {  # node -> "tx rx" of its eth1, seen from the node
  ip netns exec "$PREFIX-n$1" cat /sys/class/net/eth1/statistics/tx_bytes \
    /sys/class/net/eth1/statistics/rx_bytes | tr '\n' ' '
}
TX0=(); RX0=()
for ((k = 0; k < NODES; k++)); do read -r "TX0[k]" "RX0[k]" < <(counters "$k"); done

say "$NODES nodes: namespaces $PREFIX-n0..n$((NODES - 1)), eth1 $SUBNET.1..$NODES/24, bridge in $SW"
START_NS=$(date +%s%N)
TMPDIR=$RUNDIR NCCL_SOCKET_IFNAME=eth1 FI_TCP_IFACE=eth1 timeout -k 5 "$TIMEOUT" "$@" --netns-prefix "$PREFIX" &
JOB_PID=$!
wait "$JOB_PID"; RC=$?
JOB_PID=""
END_NS=$(date +%s%N)

echo
say "bytes on each node's link during the run (tx = sent by the node, rx = received)"
printf '%-8s %14s %14s\n' node tx_bytes rx_bytes
short=0
for ((k = 0; k < NODES; k++)); do
  read -r tx rx < <(counters "$k")
  tx=$((tx - TX0[k])); rx=$((rx - RX0[k]))
  printf '%-8s %14d %14d\n' "node$k" "$tx" "$rx"
  [ "$tx" -ge "$MIN_BYTES" ] && [ "$rx" -ge "$MIN_BYTES" ] || short=$((short + 1))
done
say "run took $(( (END_NS - START_NS) / 1000000 )) ms"
[ "$RC" = 124 ] && say "the trainer timed out after $TIMEOUT s (--timeout)"
if [ "$RC" != 0 ]; then
  say "FAIL: the trainer exited with status $RC"
  exit "$RC"
fi
if [ "$short" != 0 ]; then
  say "FAIL: $short node link(s) carried less than $MIN_BYTES bytes one way: the ranks did not talk across the links"
  exit 1
fi
say "PASS: the trainer passed and every node's link carried at least $MIN_BYTES bytes each way"
