#!/usr/bin/env bash
# Rank wrapper for cluster.sh (run by mpirun in front of COMMAND):
#   rank.sh [--hostid-div L] [--log-dir DIR] -- COMMAND [ARGS]
#  --hostid-div L  loopback mode: NCCL_HOSTID=node<rank / L> (ranks are
#                  placed by slot, so node K holds ranks K*L..K*L+L-1)
#  --log-dir DIR   link-down mode: copy the rank's stdout and stderr to
#                  DIR/rank<R>.log and, when it ends, write
#                  "<exit status> <end time ns> <NCCL_HOSTID>" to DIR/rank<R>.status;
#                  SHOAL_TEST_READY_FILE=DIR/rank<R>.ready for the program
set -u
DIV=""; LOGDIR=""
while [ $# -gt 0 ]; do
  case $1 in
    --hostid-div) DIV=$2; shift 2 ;;
    --log-dir) LOGDIR=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "rank.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
RANK=${OMPI_COMM_WORLD_RANK:?rank.sh runs under mpirun}
[ -n "$DIV" ] && export NCCL_HOSTID=node$((RANK / DIV))
[ -n "$LOGDIR" ] || exec "$@"

# The program may touch this file once it is ready (link-down timing).
export SHOAL_TEST_READY_FILE=$LOGDIR/rank$RANK.ready
LOG=$LOGDIR/rank$RANK.log
: >"$LOG"
"$@" > >(tee -a "$LOG") 2> >(tee -a "$LOG" >&2)
rc=$?
echo "$rc $(date +%s%N) ${NCCL_HOSTID:-?}" >"$LOGDIR/rank$RANK.status.tmp"
mv "$LOGDIR/rank$RANK.status.tmp" "$LOGDIR/rank$RANK.status"
exit "$rc"
