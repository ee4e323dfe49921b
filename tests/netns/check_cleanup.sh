#!/usr/bin/env bash
# The harness leaves nothing behind: runs cluster.sh three ways (COMMAND
# fails; SIGTERM mid-run; SIGINT mid-run) and checks that none of its
# namespaces, processes or run folders outlive it, and that the root
# namespace gained no interface. Exit 77 (skip) where namespaces cannot be made.
#   check_cleanup.sh [path/to/cluster.sh]
set -u
CLUSTER=${1:-$(dirname "$0")/cluster.sh}
fail=0
links_before=$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sort)

probe=$("$CLUSTER" --nodes 2 --ranks-per-node 1 --timeout 30 -- true 2>&1)
if echo "$probe" | grep -q 'network namespaces not used'; then
  echo "check_cleanup: namespaces unavailable here, nothing to check"
  exit 77
fi

leftovers() {  # pid -> what run <pid> left behind, if anything
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^shoal-$1-" | sed 's/^/namespace /'
  ls -d /tmp/shoal-"$1".* 2>/dev/null | sed 's/^/folder /'
}

check() {  # label pid
  local left
  left=$(leftovers "$2")
  if [ -n "$left" ]; then
    echo "check_cleanup: $1: LEFT BEHIND:"; echo "$left"; fail=1
  else
    echo "check_cleanup: $1: nothing left"
  fi
}

# 1. COMMAND fails: the harness passes its status on and removes everything.
"$CLUSTER" --nodes 2 --ranks-per-node 2 --timeout 30 -- false >/dev/null 2>&1 &
pid=$!; wait "$pid"; rc=$?
[ "$rc" != 0 ] || { echo "check_cleanup: failing COMMAND gave status 0"; fail=1; }
check "failing command (status $rc)" "$pid"

# 2./3. Signals while ranks run: namespaces up, orteds and ranks inside them.
# Job control on, so that the background run does not start with SIGINT
# ignored (as a non-interactive shell's background jobs otherwise do).
set -m
for sig in TERM INT; do
  "$CLUSTER" --nodes 2 --ranks-per-node 2 --timeout 30 -- sleep 25 >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    n=$(ip netns pids "shoal-$pid-n1" 2>/dev/null | wc -l)
    [ "$n" -ge 3 ] && break        # orted + 2 ranks on node 1
    sleep 0.1
  done
  [ "$n" -ge 3 ] || { echo "check_cleanup: SIG$sig: ranks never started on node1"; fail=1; }
  kill -"$sig" "$pid"
  wait "$pid"; rc=$?
  case $sig:$rc in TERM:143|INT:130) ;; *) echo "check_cleanup: SIG$sig gave status $rc"; fail=1 ;; esac
  check "SIG$sig mid-run (status $rc)" "$pid"
done

links_after=$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sort)
if [ "$links_before" != "$links_after" ]; then
  echo "check_cleanup: the root namespace's interfaces changed:"
  diff <(echo "$links_before") <(echo "$links_after"); fail=1
fi
[ "$fail" = 0 ] && echo "check_cleanup: PASS" || echo "check_cleanup: FAIL"
exit "$fail"
