#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs the
# consumer against it through find_package(shoal) and through
# pkg-config --cflags --libs shoal; checks the layout never shadows NVIDIA's
# NCCL (no libnccl.so* in <prefix>/lib, no nccl.h in <prefix>/include) and
# that the installed benchmark runs from libexec/shoal.
#   prefix_consumer_test.sh BUILD_DIR TEST_DIR CMAKE PKG_CONFIG CC
set -euo pipefail
build=$1 here=$2 cmake=$3 pkgconfig=$4 cc=$5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "FAIL: $*" >&2; exit 1; }

"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
libdir=$prefix/lib
[ -f "$libdir/shoal/libnccl.so.2" ] || fail "no $libdir/shoal/libnccl.so.2"
[ -L "$libdir/shoal/libnccl.so" ] || fail "no libnccl.so link in $libdir/shoal"
shadow=$(find "$libdir" -maxdepth 1 -name 'libnccl.so*')
[ -z "$shadow" ] || fail "libnccl in the default library directory: $shadow"
[ ! -e "$prefix/include/nccl.h" ] || fail "nccl.h in the default include directory"
for f in include/shoal/nccl.h include/shoal/shoal/shoal.h lib/cmake/shoal/shoalConfig.cmake \
         lib/cmake/shoal/shoalConfigVersion.cmake lib/cmake/shoal/shoalTargets.cmake \
         lib/pkgconfig/shoal.pc bin/shoal-info bin/shoal-hang-report libexec/shoal/all_reduce_perf; do
  [ -e "$prefix/$f" ] || fail "missing $f"
done

check_run() {  # binary label: runs it, checks the library is the installed one
  local out
  out=$("$1") || { echo "$out"; fail "$2: consumer failed"; }
  echo "$out"
  grep -q "^library: $libdir/shoal/libnccl.so.2" <<<"$out" || fail "$2: served by another libnccl.so.2"
  grep -q "^allreduce: ok" <<<"$out" || fail "$2: no result line"
}

# find_package(shoal CONFIG)
"$cmake" -S "$here/consumer" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" >"$tmp/configure.log" || { cat "$tmp/configure.log"; fail "configure consumer"; }
grep "shoal 0" "$tmp/configure.log"
"$cmake" --build "$tmp/cmake-build" >"$tmp/build.log" || { cat "$tmp/build.log"; fail "build consumer"; }
check_run "$tmp/cmake-build/consumer" find_package

# pkg-config
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$("$pkgconfig" --cflags --libs shoal)
echo "pkg-config --cflags --libs shoal: $flags"
# shellcheck disable=SC2086
"$cc" -o "$tmp/pc-consumer" "$here/consumer/consumer.c" $flags -ldl
check_run "$tmp/pc-consumer" pkg-config

# A benchmark from libexec/shoal finds the library by its relative RUNPATH.
"$prefix/libexec/shoal/all_reduce_perf" -t 2 -b 8 -e 1K -f 4 -c 1 -n 2 -w 1 >"$tmp/bench.log" ||
  { cat "$tmp/bench.log"; fail "installed all_reduce_perf"; }
grep -q "Out of bounds values : 0 OK" "$tmp/bench.log" || { cat "$tmp/bench.log"; fail "all_reduce_perf data check"; }
echo "PASS"
