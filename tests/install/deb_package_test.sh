#!/usr/bin/env bash
# Builds the Debian package with CPack and checks it: the file name, its
# control fields (no Conflicts, Replaces or Provides against libnccl2:
# docs/decisions/0016-install-layout-and-debian-package.md), its contents (the
# library only under /usr/lib/shoal, no libnccl.so* in a default library
# directory, headers under /usr/include/shoal, shoal-info, CMake config,
# shoal.pc, the benchmarks in /usr/libexec/shoal), then unpacks it into a
# temporary root (dpkg -x) and runs shoal-info, an installed benchmark and
# the consumer built through the unpacked pkg-config file from there.
#   deb_package_test.sh BUILD_DIR TEST_DIR VERSION PKG_CONFIG CC
set -euo pipefail
build=$1 here=$2 version=$3 pkgconfig=$4 cc=$5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

(cd "$tmp" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/out" >"$tmp/cpack.log" 2>&1) ||
  { cat "$tmp/cpack.log"; fail "cpack -G DEB"; }
deb=$tmp/out/shoal_${version}_amd64.deb
[ -f "$deb" ] || { ls -l "$tmp/out"; fail "no $(basename "$deb")"; }
echo "package: $(basename "$deb") ($(stat -c %s "$deb") bytes)"

dpkg-deb -f "$deb" >"$tmp/control"
cat "$tmp/control"
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = shoal ] || fail "Package"
[ "$(field Version)" = "$version" ] || fail "Version"
[ "$(field Architecture)" = amd64 ] || fail "Architecture"
for f in Conflicts Replaces Provides Breaks; do
  [ -z "$(field $f)" ] || fail "$f is set: $(field $f) (the package shadows nothing, docs/decisions/0016)"
done
depends=$(field Depends)
grep -q 'libc6' <<<"$depends" || fail "Depends lacks libc6: $depends"
! grep -q 'nccl' <<<"$depends" || fail "Depends names an NCCL package: $depends"

dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$tmp/files"
has() { grep -qx "$1" "$tmp/files" || fail "package lacks $1"; }
has /usr/lib/shoal/libnccl.so.2
has /usr/lib/shoal/libnccl.so
has /usr/include/shoal/nccl.h
has /usr/include/shoal/shoal/shoal.h
has /usr/bin/shoal-info
has /usr/bin/shoal-hang-report
has /usr/lib/cmake/shoal/shoalConfig.cmake
has /usr/lib/cmake/shoal/shoalConfigVersion.cmake
has /usr/lib/cmake/shoal/shoalTargets.cmake
has /usr/lib/pkgconfig/shoal.pc
has /usr/libexec/shoal/all_reduce_perf
# Nothing that could shadow NVIDIA's packages: no libnccl outside the private
# directory, no nccl.h in /usr/include, no nccl-tests names in /usr/bin.
bad=$(grep -E '/libnccl\.so' "$tmp/files" | grep -v '^/usr/lib/shoal/' || true)
[ -z "$bad" ] || fail "libnccl outside /usr/lib/shoal: $bad"
! grep -qx /usr/include/nccl.h "$tmp/files" || fail "/usr/include/nccl.h in the package"
! grep -qE '^/usr/bin/[a-z_]+_perf$' "$tmp/files" || fail "a benchmark in /usr/bin"

# Trial install into a temporary root.
root=$tmp/root
dpkg -x "$deb" "$root"
"$root/usr/bin/shoal-info" --version
"$root/usr/bin/shoal-info" --ranks 2 >/dev/null || fail "unpacked shoal-info"
"$root/usr/libexec/shoal/all_reduce_perf" -t 2 -b 8 -e 1K -f 4 -c 1 -n 2 -w 1 >"$tmp/bench.log" ||
  { cat "$tmp/bench.log"; fail "unpacked all_reduce_perf"; }
grep -q "Out of bounds values : 0 OK" "$tmp/bench.log" || fail "unpacked all_reduce_perf data check"
loaded=$(ldd "$root/usr/libexec/shoal/all_reduce_perf" | awk '$1 == "libnccl.so.2" {print $3}')
[ -n "$loaded" ] && [ "$(realpath "$loaded")" = "$(realpath "$root/usr/lib/shoal/libnccl.so.2")" ] ||
  fail "the unpacked benchmark loads '$loaded', not the unpacked library"
# The consumer through the unpacked shoal.pc, its prefix moved to the root.
flags=$("$pkgconfig" --define-prefix --cflags --libs "$root/usr/lib/pkgconfig/shoal.pc")
echo "pkg-config --define-prefix: $flags"
# shellcheck disable=SC2086
"$cc" -o "$tmp/consumer" "$here/consumer/consumer.c" $flags -ldl
out=$("$tmp/consumer") || { echo "$out"; fail "consumer against the unpacked package"; }
echo "$out"
grep -q "^library: $root/usr/lib/shoal/libnccl.so.2" <<<"$out" || fail "consumer served by another library"
echo "PASS"
