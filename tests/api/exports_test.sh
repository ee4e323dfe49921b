#!/usr/bin/env bash
# libnccl.so.2 exports every function nccl.h declares, as weak ncclX plus strong
# pncclX, unversioned, and nothing but nccl*, pnccl* and shoal*; soname libnccl.so.2.
#   exports_test.sh <libnccl.so.2> <nccl.h>
set -euo pipefail
lib=$1 header=$2
fail=0
declared=$(grep -oE '^(ncclResult_t|const char\*|void) +nccl[A-Za-z0-9_]+\(' "$header" |
           grep -oE 'nccl[A-Za-z0-9_]+' | grep -v '_t$' | sort -u)
syms=$(nm -D --defined-only "$lib")
for f in $declared; do
  grep -qE " W $f\$" <<<"$syms" || { echo "missing weak $f"; fail=1; }
  grep -qE " T p$f\$" <<<"$syms" || { echo "missing strong p$f"; fail=1; }
done
others=$(awk '{print $3}' <<<"$syms" | grep -vE '^(nccl|pnccl|shoal)' || true)
[ -z "$others" ] || { echo "unexpected exports: $others"; fail=1; }
if objdump -T "$lib" | grep -E ' (nccl|pnccl)' | grep -vq 'Base'; then
  echo "versioned nccl symbols found"; fail=1
fi
readelf -d "$lib" | grep -q 'SONAME.*\[libnccl.so.2\]' || { echo "soname is not libnccl.so.2"; fail=1; }
n=$(wc -w <<<"$declared")
[ "$fail" = 0 ] && echo "ok: $n functions exported as ncclX (weak) + pncclX (strong)"
exit "$fail"
