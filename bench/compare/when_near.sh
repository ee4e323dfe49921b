#!/bin/bash
# Waits for the VM's two vCPUs to sit close (the placement in which Shoal's
# smallest shared-memory collectives were measured behind Open MPI's vader,
# docs/performance.md, "Small messages with the vCPUs near"), then runs a
# command once.
#
#   bench/compare/when_near.sh [--below US] [--every S] [--for S] -- COMMAND...
#
# Every --every seconds (15) it reads the 64-byte one-way time of
# bench/compare/probe.c; when that is at most --below microseconds (0.12; the
# near placement reads ~0.08, the far one 0.28-0.36) it runs COMMAND and
# exits with its status, after printing the probe again (the placement can
# change within seconds: a run is near only if the probe reads near after it
# too). It gives up after --for seconds (1500) with status 2. The near
# placement is rare and short: keep COMMAND short (few sizes, few iterations).
set -u
below=0.12 every=15 limit=1500
while [ $# -gt 0 ]; do
  case "$1" in
    --below) below=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --for) limit=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "when_near.sh: unknown option $1" >&2; exit 64 ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: when_near.sh [--below US] [--every S] [--for S] -- COMMAND..." >&2; exit 64; }
here=$(cd "$(dirname "$0")" && pwd)
probe=$(mktemp /tmp/shoal-probe.XXXXXX)
trap 'rm -f "$probe"' EXIT
gcc -O2 -o "$probe" "$here/probe.c" || exit 1
oneway() { "$probe" -s 64 -n 20000 -r 1 | awk '{print $(NF-4)}'; }
end=$(( $(date +%s) + limit ))
while [ "$(date +%s)" -lt "$end" ]; do
  v=$(oneway)
  if awk -v v="$v" -v b="$below" 'BEGIN { exit !(v != "" && v <= b) }'; then
    echo "when_near.sh: $(date +%T) 64 B probe $v us: running the command"
    "$@"
    status=$?
    echo "when_near.sh: $(date +%T) 64 B probe after the command: $(oneway) us"
    exit $status
  fi
  sleep "$every"
done
echo "when_near.sh: no near placement within $limit s (last probe ${v:-none} us)" >&2
exit 2
