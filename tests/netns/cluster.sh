#!/usr/bin/env bash
# Emulated multi-node cluster on one machine: runs COMMAND as one mpirun job
# whose "nodes" are network namespaces joined by veth pairs to a bridge.
#
#   cluster.sh --nodes N --ranks-per-node L [--rails R] [--rate RATE] [--timeout S]
#              [--link-down-after SECONDS NODE [--link-down-wait S]
#               [--link-down-require error|named|survive]]
#              [--loopback] [--keep-logs] [--mca NAME VALUE]... [--sysctl KEY=VALUE]...
#              -- COMMAND [ARGS]
#   cluster.sh --cleanup-stale      remove what dead runs left behind
#   cluster.sh --list               namespaces of this harness (live or stale)
#
# Layout of one run (P = this script's pid; nothing is added to the root
# namespace, which sees neither the bridge nor any veth end nor any address):
#
#   namespace shoal-P-sw  bridge br0 10.77.0.254/24, ports n0..n{N-1}; mpirun runs here
#   namespace shoal-P-nK  eth1 10.77.0.(K+1)/24 (veth peer of port nK), lo;
#                         UTS hostname nodeK; one orted and the L ranks of node K
#   --rails R (R > 1)     R links per node, as a cluster node with R NICs:
#                         ethJ (J = 1..R) on bridge br(J-1), 10.77.(J-1).(K+1)/24,
#                         switch port nK (J = 1) or nK-J; ranks get
#                         NCCL_SOCKET_IFNAME=eth (every rail) and no FI_TCP_IFACE;
#                         --rate and --link-down-after act on every rail
#   --link-down-after SECONDS NODE: NODE's link goes down SECONDS after every
#                         rank touched $SHOAL_TEST_READY_FILE (set per rank;
#                         the program's sign that it is in its loop), or after
#                         launch if one ends first
#   --link-down-require   the verdict: every rank ends with an error (error),
#                         and names a rank beyond the cut (named, the default);
#                         survive: the cut node's ranks end with an error, the
#                         others exit 0 having printed "survived" (they shrank
#                         their communicator around the cut and went on)
#   --sysctl KEY=VALUE    set in every node namespace before the job (net.*
#                         keys only, which are per namespace, e.g.
#                         net.ipv4.tcp_notsent_lowat; decision 0009's evidence)
#
# mpirun starts one orted per node through a generated plm_rsh_agent that
# does `ip netns exec shoal-P-nK unshare --uts` instead of ssh, exactly as it
# would start daemons on a cluster; each orted runs its own PMIx server inside
# its namespace, so ranks reach it over their own lo. Ranks get
# NCCL_HOSTID=nodeK, NCCL_SOCKET_IFNAME=eth1, FI_TCP_IFACE=eth1 and
# GLOO_SOCKET_IFNAME=eth1 (the last three unless the caller set them; lo
# without namespaces), plus every NCCL_*, SHOAL_* and FI_*
# variable of the caller. See README.md for why.
#
# mpirun gets --mca pml ob1 --mca btl self,vader,tcp; each --mca NAME VALUE
# is passed on to it, and one for pml or btl replaces that default (mpirun
# refuses a name given twice), e.g. for Open MPI's libfabric MTL:
# --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_exclude none.
#
# After COMMAND, prints the bytes each node's link carried (tx = sent by the
# node, rx = received by it; per rail with --rails), then each node's TCP
# segments sent and retransmitted, and exits with mpirun's status. Everything is
# removed on exit, on INT/TERM/HUP and on failure.
#
# Without the right to make namespaces (not root, no CAP_NET_ADMIN, no
# iproute2) the run fails (exit 2), unless SHOAL_NETNS_ALLOW_LOOPBACK=1: then,
# as with --loopback, the same job runs on loopback with NCCL_HOSTID=nodeK
# grouping (ranks K*L..K*L+L-1 form node K), and a REDUCED line says so;
# --rate, --link-down-after and --sysctl need namespaces and are refused there
# (exit 77, CTest's skip code for tests declared with SKIP_RETURN_CODE 77).
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF=$HERE/$(basename "${BASH_SOURCE[0]}")
PREFIX=shoal-$$
SUBNET=10.77.0
IFNAME=eth1
SKIP=77

die() { echo "cluster.sh: $*" >&2; exit 2; }
say() { echo "cluster.sh: $*"; }

usage() {
  sed -n '2,/^set -u/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

# --- housekeeping modes -----------------------------------------------------

# Namespaces made by this harness: shoal-<pid>-sw and shoal-<pid>-n<k>.
harness_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^shoal-[0-9]+-(sw|n[0-9]+)$'
}

owner_alive() {  # pid -> 0 if that pid is a live cluster.sh
  local pid=$1
  [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'cluster\.sh'
}

# Kills what still runs inside a namespace (orted and ranks this harness
# started there), then deletes it; its veth ends and bridge go with it.
remove_namespace() {
  local ns=$1 pids
  pids=$(ip netns pids "$ns" 2>/dev/null)
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  ip netns del "$ns" 2>/dev/null
}

cleanup_stale() {
  local ns pid dir removed=0
  for ns in $(harness_namespaces); do
    pid=${ns#shoal-}; pid=${pid%%-*}
    if ! owner_alive "$pid"; then
      remove_namespace "$ns" && removed=$((removed + 1)) && echo "removed $ns (pid $pid is gone)"
    fi
  done
  for dir in /tmp/shoal-[0-9]*.??????; do
    [ -d "$dir" ] || continue
    pid=${dir#/tmp/shoal-}; pid=${pid%%.*}
    owner_alive "$pid" || { rm -rf "$dir"; echo "removed $dir"; }
  done
  echo "cluster.sh: removed $removed stale namespace(s)"
}

# --- arguments --------------------------------------------------------------

NODES=""; RPN=""; RAILS=1; RATE=""; TIMEOUT=600; DOWN_AFTER=""; DOWN_NODE=""; DOWN_WAIT=30
DOWN_REQUIRE=named; FORCE_LOOPBACK=0; KEEP_LOGS=0; SYSCTLS=()
# shellcheck disable=SC2054  # the commas belong to an MCA value
MCA_PML=ob1; MCA_BTL=self,vader,tcp; MCA_MORE=()
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) NODES=${2:-}; shift 2 ;;
    --ranks-per-node) RPN=${2:-}; shift 2 ;;
    --rails) RAILS=${2:-}; shift 2 ;;
    --rate) RATE=${2:-}; shift 2 ;;
    --timeout) TIMEOUT=${2:-}; shift 2 ;;
    --link-down-after) DOWN_AFTER=${2:-}; DOWN_NODE=${3:-}; shift 3 ;;
    --link-down-wait) DOWN_WAIT=${2:-}; shift 2 ;;
    --link-down-require) DOWN_REQUIRE=${2:-}; shift 2 ;;
    --loopback) FORCE_LOOPBACK=1; shift ;;
    --keep-logs) KEEP_LOGS=1; shift ;;
    --sysctl)
      [[ ${2:-} == net.?*=* ]] || die "--sysctl needs KEY=VALUE with a net.* key (those are per namespace; others would change the host)"
      SYSCTLS+=("$2"); shift 2 ;;
    --mca)
      [ $# -ge 3 ] && [[ -n $2 && $2 != -* && $3 != -- ]] || die "--mca needs NAME and VALUE"
      case $2 in
        pml) MCA_PML=$3 ;;
        btl) MCA_BTL=$3 ;;
        *) MCA_MORE+=(--mca "$2" "$3") ;;
      esac
      shift 3 ;;
    --cleanup-stale) cleanup_stale; exit 0 ;;
    --list) harness_namespaces; exit 0 ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (--help for the interface)" ;;
  esac
done
[ $# -gt 0 ] || die "no COMMAND after '--'"
[[ $NODES =~ ^[1-9][0-9]*$ ]] && [ "$NODES" -le 200 ] || die "--nodes must be 1..200"
[[ $RPN =~ ^[1-9][0-9]*$ ]] || die "--ranks-per-node must be a positive integer"
[[ $RAILS =~ ^[1-8]$ ]] || die "--rails must be 1..8"
[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "--timeout must be whole seconds"
[[ $DOWN_WAIT =~ ^[1-9][0-9]*$ ]] || die "--link-down-wait must be whole seconds"
[[ $DOWN_REQUIRE =~ ^(error|named|survive)$ ]] || die "--link-down-require must be 'error', 'named' or 'survive'"
if [ -n "$DOWN_AFTER" ]; then
  [[ $DOWN_AFTER =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--link-down-after SECONDS NODE: bad SECONDS"
  [[ $DOWN_NODE =~ ^[0-9]+$ ]] && [ "$DOWN_NODE" -lt "$NODES" ] ||
    die "--link-down-after SECONDS NODE: NODE must be 0..$((NODES - 1))"
fi
NP=$((NODES * RPN))

# tc rate -> bytes per second (tc's units; SI multipliers).
rate_bytes() {
  local r=${1,,} num unit
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$ ]] || return 1
  num=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[3]}
  awk -v n="$num" -v u="$unit" 'BEGIN {
    m["bit"]=1/8; m["kbit"]=1e3/8; m["mbit"]=1e6/8; m["gbit"]=1e9/8; m["tbit"]=1e12/8;
    m["bps"]=1; m["kbps"]=1e3; m["mbps"]=1e6; m["gbps"]=1e9; m["tbps"]=1e12;
    printf "%.0f\n", n * m[u] }'
}
if [ -n "$RATE" ]; then
  RATE_BPS=$(rate_bytes "$RATE") || die "--rate '$RATE': use a tc rate such as 10gbit, 500mbit, 100mbps"
  [ "$RATE_BPS" -gt 0 ] || die "--rate must be positive"
fi

# The caller's NCCL_*, SHOAL_* and FI_* variables, forwarded to every rank.
# NCCL_HOSTID is the harness's: it names the emulated node of each rank.
FORWARD=()
CALLER_IFNAME=0; CALLER_FI_IFACE=0
while IFS= read -r name; do
  case $name in
    NCCL_HOSTID) say "ignoring the caller's NCCL_HOSTID: each node sets its own" ; continue ;;
    NCCL_SOCKET_IFNAME) CALLER_IFNAME=1 ;;
    FI_TCP_IFACE) CALLER_FI_IFACE=1 ;;
  esac
  FORWARD+=(-x "$name")
done < <(compgen -e | grep -E '^(NCCL|SHOAL|FI)_' | sort)

now_ns() { date +%s%N; }

# --- mode: namespaces or loopback ------------------------------------------

MODE=netns
WHY=""
if [ "$FORCE_LOOPBACK" = 1 ]; then
  MODE=loopback; WHY="--loopback given"
elif ! command -v ip >/dev/null 2>&1; then
  MODE=loopback; WHY="iproute2 ('ip') is not installed"
elif ! command -v unshare >/dev/null 2>&1; then
  MODE=loopback; WHY="'unshare' (util-linux) is not installed"
elif [ -n "$RATE" ] && ! command -v tc >/dev/null 2>&1; then
  MODE=loopback; WHY="--rate needs 'tc' (iproute2)"
fi
command -v mpirun >/dev/null 2>&1 || die "mpirun not found (Open MPI)"

SW=$PREFIX-sw
NS=()
for ((k = 0; k < NODES; k++)); do NS+=("$PREFIX-n$k"); done
MADE=()            # namespaces this run created, removed by cleanup
RUNDIR=""
JOB_PID=""
DOWN_PID=""

cleanup() {
  local rc=$? ns
  trap - EXIT INT TERM HUP
  [ -n "$DOWN_PID" ] && kill "$DOWN_PID" 2>/dev/null
  if [ -n "$JOB_PID" ] && kill -0 "$JOB_PID" 2>/dev/null; then
    kill -TERM "$JOB_PID" 2>/dev/null     # timeout passes it on to mpirun
    for _ in $(seq 30); do kill -0 "$JOB_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$JOB_PID" 2>/dev/null
    wait "$JOB_PID" 2>/dev/null
  fi
  for ns in "${MADE[@]}"; do remove_namespace "$ns"; done
  if [ -n "$RUNDIR" ]; then
    if [ "$KEEP_LOGS" = 1 ]; then say "logs kept in $RUNDIR"; else rm -rf "$RUNDIR"; fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

RUNDIR=$(mktemp -d "/tmp/$PREFIX.XXXXXX") || die "mktemp failed"
chmod 755 "$RUNDIR"

# Rail j (0-based): the node's device, the switch port of node k, the subnet.
rail_dev() { echo "eth$(($1 + 1))"; }
rail_port() { if [ "$2" = 0 ]; then echo "n$1"; else echo "n$1-$(($2 + 1))"; fi; }
rail_subnet() { echo "10.77.$1"; }

make_namespaces() {  # -> 0, or 1 with WHY set
  local k j err
  if ! err=$(ip netns add "$SW" 2>&1); then
    WHY="cannot create network namespaces ($err)"; return 1
  fi
  MADE+=("$SW")
  ip -n "$SW" link set lo up || { WHY="cannot set up the switch namespace"; return 1; }
  for ((j = 0; j < RAILS; j++)); do
    ip -n "$SW" link add "br$j" type bridge &&
      ip -n "$SW" addr add "$(rail_subnet "$j").254/24" dev "br$j" &&
      ip -n "$SW" link set "br$j" up || { WHY="cannot set up bridge br$j"; return 1; }
  done
  for ((k = 0; k < NODES; k++)); do
    ip netns add "${NS[k]}" || { WHY="cannot create ${NS[k]}"; return 1; }
    MADE+=("${NS[k]}")
    ip -n "${NS[k]}" link set lo up || { WHY="cannot set up lo of node $k"; return 1; }
    for ((j = 0; j < RAILS; j++)); do
      local dev port
      dev=$(rail_dev "$j"); port=$(rail_port "$k" "$j")
      # Both ends are created directly inside their namespaces.
      ip link add "$dev" netns "${NS[k]}" type veth peer name "$port" netns "$SW" &&
        ip -n "$SW" link set "$port" master "br$j" &&
        ip -n "$SW" link set "$port" up &&
        ip -n "${NS[k]}" addr add "$(rail_subnet "$j").$((k + 1))/24" dev "$dev" &&
        ip -n "${NS[k]}" link set "$dev" up || { WHY="cannot set up $dev of node $k"; return 1; }
    done
    for kv in "${SYSCTLS[@]}"; do
      ip netns exec "${NS[k]}" sysctl -q -w "$kv" >/dev/null || die "--sysctl $kv failed in node $k"
    done
  done
  return 0
}

if [ "$MODE" = netns ] && ! make_namespaces; then
  for ns in "${MADE[@]}"; do remove_namespace "$ns"; done
  MADE=()
  MODE=loopback
fi

if [ "$MODE" = loopback ]; then
  # Emulated nodes without namespaces test much less (no per-node links): only
  # with --loopback or SHOAL_NETNS_ALLOW_LOOPBACK=1 does a run go on (or skip)
  # that way; otherwise it fails, so that a test run cannot pass on less.
  if [ "$FORCE_LOOPBACK" != 1 ] && [ "${SHOAL_NETNS_ALLOW_LOOPBACK:-0}" != 1 ]; then
    die "network namespaces not used: $WHY (set SHOAL_NETNS_ALLOW_LOOPBACK=1 to run on loopback instead)"
  fi
  say "REDUCED: network namespaces not used: $WHY; running $NODES x $RPN ranks on loopback with NCCL_HOSTID=node<k> grouping (no per-node links)"
  if [ -n "$RATE" ]; then say "--rate needs namespaces: skipped"; exit $SKIP; fi
  if [ -n "$DOWN_AFTER" ]; then say "--link-down-after needs namespaces: skipped"; exit $SKIP; fi
  if [ ${#SYSCTLS[@]} -gt 0 ]; then say "--sysctl needs namespaces: skipped"; exit $SKIP; fi
fi

# --- links: rate limits and counters ----------------------------------------

if [ -n "$RATE" ]; then
  # tbf needs a bucket of at least rate/HZ plus one (GSO) packet; 10 ms of
  # the rate, and no less than 64 KiB, holds for any HZ >= 100.
  BURST=$(( RATE_BPS / 100 > 65536 ? RATE_BPS / 100 : 65536 ))
  for ((k = 0; k < NODES; k++)); do
    for ((j = 0; j < RAILS; j++)); do
      # node egress (its device) and node ingress (the bridge port's egress)
      tc -n "${NS[k]}" qdisc add dev "$(rail_dev "$j")" root tbf rate "$RATE" burst "$BURST" latency 50ms &&
        tc -n "$SW" qdisc add dev "$(rail_port "$k" "$j")" root tbf rate "$RATE" burst "$BURST" latency 50ms ||
        die "tc tbf on node $k rail $j failed"
    done
  done
  say "every node link limited to $RATE each way (tbf burst $BURST bytes, latency 50ms)"
fi

# tx and rx bytes of node k's rail j, seen from the node (in its namespace).
node_counters() {
  if [ "$MODE" = netns ]; then
    local dev
    dev=$(rail_dev "$2")
    ip netns exec "${NS[$1]}" cat "/sys/class/net/$dev/statistics/tx_bytes" \
      "/sys/class/net/$dev/statistics/rx_bytes" 2>/dev/null | tr '\n' ' '
  else
    cat /sys/class/net/lo/statistics/tx_bytes /sys/class/net/lo/statistics/rx_bytes | tr '\n' ' '
  fi
}
BEFORE_TX=(); BEFORE_RX=(); AFTER_TX=(); AFTER_RX=()
read_all_counters() {  # BEFORE|AFTER: fills <name>_TX and <name>_RX, index k*RAILS+j
  # shellcheck disable=SC2034  # namerefs: written through read below
  local -n tx=$1_TX rx=$1_RX
  local k j
  for ((k = 0; k < NODES; k++)); do
    for ((j = 0; j < RAILS; j++)); do
      read -r "tx[k*RAILS+j]" "rx[k*RAILS+j]" < <(node_counters "$k" "$j")
    done
    [ "$MODE" = loopback ] && break
  done
}

# TCP segments node k's namespace sent and retransmitted since it was made
# (/proc/net/snmp is per network namespace).
tcp_segments() {
  ip netns exec "${NS[$1]}" awk '$1 == "Tcp:" {
    if (!named) { for (i = 2; i <= NF; i++) column[$i] = i; named = 1 }
    else print $column["OutSegs"], $column["RetransSegs"] }' /proc/net/snmp
}

# --- the mpirun command -------------------------------------------------------

MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$NP"
        --mca pml "$MCA_PML" --mca btl "$MCA_BTL" "${MCA_MORE[@]}")
WRAP=()   # rank wrapper, when one is needed
if [ "$MODE" = netns ]; then
  HOSTFILE=$RUNDIR/hostfile
  AGENT=$RUNDIR/agent.sh
  for ((k = 0; k < NODES; k++)); do echo "node$k slots=$RPN"; done >"$HOSTFILE"
  # ssh stand-in: "agent.sh [-opts] nodeK remote command words". Starts the
  # orted of node K inside its namespace with its own hostname; the ranks it
  # forks inherit NCCL_HOSTID from it.
  cat >"$AGENT" <<EOF
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
k=\${host#node}
exec ip netns exec "$PREFIX-n\$k" unshare --uts env NCCL_HOSTID="\$host" sh -c "hostname \$host && \$*"
EOF
  chmod 755 "$AGENT"
  MPIRUN+=(--hostfile "$HOSTFILE" --map-by "ppr:$RPN:node"
           --mca plm_rsh_agent "$AGENT" --mca plm_rsh_no_tree_spawn 1
           --mca oob_tcp_if_include "$SUBNET.0/24" --mca btl_tcp_if_include "$SUBNET.0/24")
  # The caller's choice wins; say so, since the nodes only have lo and eth1..
  # With several rails, "eth" names them all (NCCL's prefix match) and
  # libfabric's tcp provider is left to list every interface.
  IFNAMES=$IFNAME
  [ "$RAILS" -gt 1 ] && IFNAMES=eth
  if [ "$CALLER_IFNAME" = 1 ]; then
    say "forwarding the caller's NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME (the nodes' links: $IFNAMES)"
  else
    MPIRUN+=(-x "NCCL_SOCKET_IFNAME=$IFNAMES")
  fi
  if [ "$CALLER_FI_IFACE" = 1 ]; then
    say "forwarding the caller's FI_TCP_IFACE=$FI_TCP_IFACE (the nodes' links: $IFNAMES)"
  elif [ "$RAILS" = 1 ]; then
    MPIRUN+=(-x "FI_TCP_IFACE=$IFNAME")
  fi
  MPIRUN+=(-x "GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$IFNAME}")  # Gloo peers (bench/compare)
  LAUNCH=(ip netns exec "$SW")
else
  MPIRUN+=(--mca oob_tcp_if_include lo --mca btl_tcp_if_include lo)
  [ "$CALLER_IFNAME" = 1 ] || MPIRUN+=(-x NCCL_SOCKET_IFNAME=lo)
  [ "$CALLER_FI_IFACE" = 1 ] || MPIRUN+=(-x FI_TCP_IFACE=lo)
  MPIRUN+=(-x "GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}")
  WRAP=("$HERE/rank.sh" --hostid-div "$RPN")
  LAUNCH=()
fi
MPIRUN+=("${FORWARD[@]}")

if [ -n "$DOWN_AFTER" ]; then
  # Ranks on a cut node cannot report through their orted, and mpirun would
  # end the job at the first failed rank: each rank records its own output,
  # exit status and end time, and no rank's exit ends the others.
  mkdir -p "$RUNDIR/ranks" && chmod 777 "$RUNDIR/ranks"
  [ ${#WRAP[@]} -gt 0 ] || WRAP=("$HERE/rank.sh")
  WRAP+=(--log-dir "$RUNDIR/ranks")
  MPIRUN+=(--mca orte_abort_on_non_zero_status 0 --mca orte_allowed_exit_without_sync 1)
fi
[ ${#WRAP[@]} -gt 0 ] && WRAP+=(--)

# --- run ----------------------------------------------------------------------

if [ "$MODE" = netns ]; then
  say "$NODES nodes x $RPN ranks: namespaces $PREFIX-n0..n$((NODES - 1)), $IFNAME $SUBNET.1..$NODES/24, bridge in $SW$([ "$RAILS" -gt 1 ] && echo ", $RAILS rails (eth1..eth$RAILS)")"
fi
read_all_counters BEFORE
START_NS=$(now_ns)
timeout -k 5 "$TIMEOUT" "${LAUNCH[@]}" "${MPIRUN[@]}" "${WRAP[@]}" "$@" &
JOB_PID=$!

if [ -n "$DOWN_AFTER" ]; then
  (
    # SECONDS after every rank is in its loop (touched its ready file), or
    # after launch for a program that never says so: start-up time, which
    # varies on a loaded machine, is not counted.
    for ((i = 0; i < TIMEOUT * 10; i++)); do
      [ "$(find "$RUNDIR/ranks" -name '*.ready' | wc -l)" -ge "$NP" ] && break
      [ "$(find "$RUNDIR/ranks" -name '*.status' | wc -l)" -gt 0 ] && break
      sleep 0.1
    done
    sleep "$DOWN_AFTER"
    now_ns >"$RUNDIR/down.tmp" && mv "$RUNDIR/down.tmp" "$RUNDIR/down"
    for ((j = 0; j < RAILS; j++)); do ip -n "$SW" link set "$(rail_port "$DOWN_NODE" "$j")" down; done
  ) &
  DOWN_PID=$!
fi

RC=""
if [ -z "$DOWN_AFTER" ]; then
  wait "$JOB_PID"; RC=$?
else
  # Ends when mpirun does, or when every rank has ended (mpirun itself may
  # wait forever for the cut node's orted), or --link-down-wait seconds after
  # the link went down.
  while kill -0 "$JOB_PID" 2>/dev/null; do
    if [ -f "$RUNDIR/down" ]; then
      done_ranks=$(find "$RUNDIR/ranks" -name '*.status' | wc -l)
      [ "$done_ranks" -ge "$NP" ] && break
      down_ns=$(cat "$RUNDIR/down")
      [ $(( ($(now_ns) - down_ns) / 1000000000 )) -ge "$DOWN_WAIT" ] && break
    fi
    sleep 0.2
  done
  if ! kill -0 "$JOB_PID" 2>/dev/null; then wait "$JOB_PID"; RC=$?; fi
fi
END_NS=$(now_ns)

# --- report -------------------------------------------------------------------

read_all_counters AFTER
echo
if [ "$MODE" = netns ]; then
  echo "cluster.sh: bytes on each node's link during the run (tx = sent by the node, rx = received)"
  if [ "$RAILS" = 1 ]; then
    printf '%-8s %14s %14s\n' node tx_bytes rx_bytes
  else
    printf '%-8s %-6s %14s %14s\n' node rail tx_bytes rx_bytes
  fi
  for ((k = 0; k < NODES; k++)); do
    for ((j = 0; j < RAILS; j++)); do
      i=$((k * RAILS + j))
      if [ "$RAILS" = 1 ]; then
        printf '%-8s %14d %14d\n' "node$k" $((AFTER_TX[i] - BEFORE_TX[i])) $((AFTER_RX[i] - BEFORE_RX[i]))
      else
        printf '%-8s %-6s %14d %14d\n' "node$k" "$(rail_dev "$j")" $((AFTER_TX[i] - BEFORE_TX[i])) $((AFTER_RX[i] - BEFORE_RX[i]))
      fi
    done
  done
  # Retransmissions cost time even when spurious (a veth between namespaces
  # reorders segments sent from two cores; docs/decisions/0009).
  echo "cluster.sh: TCP segments each node sent since its namespace was made, and how many were retransmitted"
  printf '%-8s %14s %14s\n' node tcp_segments retransmitted
  for ((k = 0; k < NODES; k++)); do
    read -r out retrans < <(tcp_segments "$k")
    printf '%-8s %14s %14s\n' "node$k" "${out:-?}" "${retrans:-?}"
  done
else
  echo "cluster.sh: loopback mode: no per-node links; lo carried (all nodes together, all traffic on the machine)"
  printf '%-8s %14s %14s\n' link tx_bytes rx_bytes
  printf '%-8s %14d %14d\n' lo $((AFTER_TX[0] - BEFORE_TX[0])) $((AFTER_RX[0] - BEFORE_RX[0]))
fi
echo "cluster.sh: run took $(( (END_NS - START_NS) / 1000000 )) ms"

if [ -z "$DOWN_AFTER" ]; then
  [ "$RC" = 124 ] && say "COMMAND timed out after $TIMEOUT s (--timeout)"
  exit "$RC"
fi

# Link-down verdict: every rank must have ended with an error within
# --link-down-wait seconds of the cut and (unless --link-down-require error)
# name at least one peer on the far side of it ("rank R" in its output).
if [ ! -f "$RUNDIR/down" ]; then
  say "link-down: the job ended (status ${RC:-?}) before node $DOWN_NODE's link was set down at +$DOWN_AFTER s"
  exit 1
fi
down_ns=$(cat "$RUNDIR/down")
say "link-down: node$DOWN_NODE's link set down at +$(( (down_ns - START_NS) / 1000000 )) ms"
printf '%-5s %-7s %-5s %-11s %-11s %s\n' rank node exit after_down named_lost last_error_line
errored=0; named=0; hung=0; survived=0; cut_errored=0
for ((r = 0; r < NP; r++)); do
  node=$((r / RPN))
  if [ "$node" = "$DOWN_NODE" ]; then
    lost=$(for ((p = 0; p < NP; p++)); do [ $((p / RPN)) = "$node" ] || echo "$p"; done | paste -sd'|')
  else
    lost=$(for ((p = DOWN_NODE * RPN; p < (DOWN_NODE + 1) * RPN; p++)); do echo "$p"; done | paste -sd'|')
  fi
  log=$RUNDIR/ranks/rank$r.log
  status=$RUNDIR/ranks/rank$r.status
  line=$(grep -v '^#' "$log" 2>/dev/null | grep -iE 'error|fail|timeout|timed out|abort' | tail -1 | cut -c1-200)
  if grep -qE "rank ($lost)([^0-9]|\$)" "$log" 2>/dev/null; then nm=yes; named=$((named + 1)); else nm=no; fi
  if [ -f "$status" ]; then
    read -r rrc rend rhost <"$status"
    after=$(awk -v a="$rend" -v b="$down_ns" 'BEGIN { printf "%.1fs", (a - b) / 1e9 }')
    [ "$rrc" != 0 ] && errored=$((errored + 1))
    [ "$rrc" != 0 ] && [ "$node" = "$DOWN_NODE" ] && cut_errored=$((cut_errored + 1))
    [ "$rrc" = 0 ] && [ "$node" != "$DOWN_NODE" ] && grep -q 'survived' "$log" 2>/dev/null &&
      survived=$((survived + 1))
    printf '%-5s %-7s %-5s %-11s %-11s %s\n' "$r" "$rhost" "$rrc" "$after" "$nm" "$line"
  else
    hung=$((hung + 1))
    printf '%-5s %-7s %-5s %-11s %-11s %s\n' "$r" "node$node" "-" "running" "$nm" "$line"
  fi
done
say "link-down: $errored/$NP ranks exited with an error, $hung still running $DOWN_WAIT s after the cut, $named/$NP named a lost peer"
if [ "$DOWN_REQUIRE" = survive ]; then
  say "link-down: $cut_errored/$RPN ranks of the cut node exited with an error, $survived/$((NP - RPN)) others survived"
  if [ "$cut_errored" = "$RPN" ] && [ "$survived" = $((NP - RPN)) ]; then
    say "link-down: PASS"
    exit 0
  fi
  say "link-down: FAIL"
  exit 1
fi
if [ "$errored" = "$NP" ] && { [ "$DOWN_REQUIRE" = error ] || [ "$named" = "$NP" ]; }; then
  say "link-down: PASS"
  exit 0
fi
say "link-down: FAIL"
exit 1
