#!/usr/bin/env bash
# libnccl.so.2 exports every function nccl.h declares, and the host functions
# of NCCL's device API (nccl_device.h, which programs such as PyTorch resolve
# at load), as weak ncclX plus strong pncclX, unversioned, and nothing but
# nccl*, pnccl* and shoal*; soname libnccl.so.2. Given NVIDIA's own
# libnccl.so.2 (present beside the CUDA toolkit), every nccl* function it
# exports is exported here too.
#   exports_test.sh <libnccl.so.2> <nccl.h> [NVIDIA's libnccl.so.2]
set -euo pipefail
lib=$1 header=$2 nvidia=${3:-}
fail=0
device_api="ncclDevCommCreate ncclDevCommDestroy ncclCommQueryProperties ncclLsaBarrierCreateRequirement
  ncclGinBarrierCreateRequirement ncclLLA2ACalcSlots ncclLLA2ACreateRequirement ncclGinOutboxCreateRequirement
  ncclGinInboxA2ACreateRequirement ncclGetLsaMultimemDevicePointer ncclGetMultimemDevicePointer
  ncclGetLsaDevicePointer ncclGetPeerDevicePointer ncclTeamWorld ncclTeamLsa ncclTeamRail ncclTeamRankToWorld
  ncclTeamRankToLsa"
declared=$( (grep -oE '^(ncclResult_t|const char\*|void) +nccl[A-Za-z0-9_]+\(' "$header" |
             grep -oE 'nccl[A-Za-z0-9_]+' | grep -v '_t$'; tr ' ' '\n' <<<"$device_api") | sed '/^$/d' | sort -u)
syms=$(nm -D --defined-only "$lib")
for f in $declared; do
  grep -qE " W $f\$" <<<"$syms" || { echo "missing weak $f"; fail=1; }
  grep -qE " T p$f\$" <<<"$syms" || { echo "missing strong p$f"; fail=1; }
done
if [ -n "$nvidia" ] && [ -f "$nvidia" ]; then
  theirs=$(nm -D --defined-only "$nvidia" | awk '{print $3}' | grep -E '^nccl' | sed 's/@.*//' | sort -u)
  ours=$(awk '{print $3}' <<<"$syms" | sort -u)
  missing=$(comm -23 <(echo "$theirs") <(echo "$ours"))
  [ -z "$missing" ] || { echo "exported by NVIDIA's $nvidia, not here:" $missing; fail=1; }
  echo "compared with NVIDIA's $nvidia: $(wc -w <<<"$theirs") nccl* functions"
fi
others=$(awk '{print $3}' <<<"$syms" | grep -vE '^(nccl|pnccl|shoal)' || true)
[ -z "$others" ] || { echo "unexpected exports: $others"; fail=1; }
if objdump -T "$lib" | grep -E ' (nccl|pnccl)' | grep -vq 'Base'; then
  echo "versioned nccl symbols found"; fail=1
fi
readelf -d "$lib" | grep -q 'SONAME.*\[libnccl.so.2\]' || { echo "soname is not libnccl.so.2"; fail=1; }
n=$(wc -w <<<"$declared")
[ "$fail" = 0 ] && echo "ok: $n functions exported as ncclX (weak) + pncclX (strong)"
exit "$fail"
