#!/usr/bin/env bash
# Builds one fuzz target with clang and runs it (tests/fuzz/README.md):
#   1. every input of tests/fuzz/corpus/TARGET once (the regression check);
#   2. a fresh run of SECONDS (default 20) seconds, mutating a temporary copy
#      of the corpus, so the repository is never modified.
# Exits with libFuzzer's status: non-zero on a crash, a sanitizer report, a
# leak, an input slower than 25 s or more than 2 GiB of memory. Crashing
# inputs are kept in build/fuzz/artifacts/TARGET/.
#
#   bash tests/fuzz/run.sh TARGET [SECONDS]
#   SHOAL_FUZZ_ARGS="-jobs=2 -workers=2" bash tests/fuzz/run.sh shm_ring 3600
#   bash tests/fuzz/run.sh --list      (the targets)
#   bash tests/fuzz/run.sh --build     (configure and build every target)
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$root/build/fuzz"

# Longest input of each target's fresh run: what its decoder can read, with
# room for a few frames or lines more than the seeds have.
declare -A MAX_LEN=(
  [store_server]=8192 [store_client]=4096 [unique_id]=128 [comm_id]=256
  [socket_ifname]=1024 [conf_file]=4096 [loopback_faults]=256 [peer_info]=4096
  [tcp_hello]=80 [tcp_segments]=32768 [shm_address]=256 [shm_ring]=32768
  [cuda_ipc_hello]=80 [ofi_hello]=128 [ofi_address]=2048
)

if [[ "${1:-}" == "--list" ]]; then
  printf '%s\n' "${!MAX_LEN[@]}" | sort
  exit 0
fi

need_clang() {
  if ! command -v clang++ >/dev/null 2>&1; then
    echo "run.sh: clang++ not found: the fuzz targets need clang and its libFuzzer runtime" >&2
    echo "        (Debian: apt-get install clang libclang-rt-14-dev; scripts/install_deps.sh does it)" >&2
    exit 1
  fi
}

# configure_and_build CMAKE_TARGET: (re)configures build/fuzz, builds one
# target; one run.sh at a time (ctest -j runs several targets at once).
configure_and_build() {
  mkdir -p "$build"
  exec 9>"$build/.lock"
  if command -v flock >/dev/null 2>&1; then flock 9; fi
  if ! cmake -S "$root/tests/fuzz" -B "$build" -DCMAKE_CXX_COMPILER=clang++ >"$build/configure.log" 2>&1 ||
     ! cmake --build "$build" --target "$1" -j"$(nproc)" >"$build/build-$1.log" 2>&1; then
    cat "$build/configure.log" "$build/build-$1.log" 2>/dev/null | tail -n 60 >&2
    echo "run.sh: building $1 failed (the ofi targets need libfabric's headers: libfabric-dev)" >&2
    exit 1
  fi
  exec 9>&-  # releases the lock (the fuzzer must not inherit it)
}

if [[ "${1:-}" == "--build" ]]; then  # every target (the fuzz.build test)
  need_clang
  configure_and_build fuzz_all
  echo "run.sh: built $(printf '%s\n' "${!MAX_LEN[@]}" | wc -l) fuzz targets in $build"
  exit 0
fi
if [[ $# -lt 1 || $# -gt 2 || -z "${MAX_LEN[$1]:-}" ]]; then
  echo "usage: $0 TARGET [SECONDS]   (targets: $(printf '%s\n' "${!MAX_LEN[@]}" | sort | tr '\n' ' '))" >&2
  exit 2
fi
target="$1"
seconds="${2:-20}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
  echo "run.sh: SECONDS must be a whole number, got '$seconds'" >&2
  exit 2
fi

need_clang
configure_and_build "fuzz_$target"
binary="$build/fuzz_$target"

work="$(mktemp -d "${TMPDIR:-/tmp}/shoal-fuzz-$target.XXXXXX")"
trap 'rm -rf "$work"' EXIT
artifacts="$build/artifacts/$target"
mkdir -p "$work/corpus" "$artifacts"
corpus="$root/tests/fuzz/corpus/$target"
if [[ -d "$corpus" ]]; then
  cp -R "$corpus/." "$work/corpus/"
fi

common=(-rss_limit_mb=2048 -timeout=25 "-artifact_prefix=$artifacts/")

# 1. Every input of the corpus once, as it is (no length limit).
mapfile -t inputs < <(find "$work/corpus" -type f | sort)
if ((${#inputs[@]})); then
  echo "run.sh: fuzz_$target: ${#inputs[@]} corpus inputs, each once"
  "$binary" "${common[@]}" "${inputs[@]}" >"$work/replay.log" 2>&1
  rc=$?
  if ((rc != 0)); then
    tail -n 60 "$work/replay.log" >&2
    echo "run.sh: fuzz_$target failed on its corpus (exit $rc)" >&2
    exit "$rc"
  fi
fi

# 2. A bounded fresh run from the corpus.
((seconds == 0)) && exit 0
echo "run.sh: fuzz_$target: fresh run of ${seconds}s, -max_len=${MAX_LEN[$target]}"
# shellcheck disable=SC2086  # SHOAL_FUZZ_ARGS is a list of flags
"$binary" "${common[@]}" -max_total_time="$seconds" -max_len="${MAX_LEN[$target]}" \
  -print_final_stats=1 ${SHOAL_FUZZ_ARGS:-} "$work/corpus" >"$work/fuzz.log" 2>&1
rc=$?
grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added|stat::peak_rss_mb)' \
  "$work/fuzz.log" || true
if ((rc != 0)); then
  tail -n 80 "$work/fuzz.log" >&2
  echo "run.sh: fuzz_$target found a problem (exit $rc); the input is in $artifacts/" >&2
fi
exit "$rc"
