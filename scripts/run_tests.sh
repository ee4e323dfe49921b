#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test.
# All traffic stays on loopback or in namespaces the tests create.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall time, said as it ends and summed up last: where a slow
# run spends its time.
start=$SECONDS
phaseStart=$SECONDS
timings=()
phase() {
  timings+=("$(printf '  %-28s %5ss' "$1" $((SECONDS - phaseStart)))")
  echo "run_tests.sh: $1 took $((SECONDS - phaseStart)) s"
  phaseStart=$SECONDS
}
bash scripts/install_deps.sh
phase "dependencies"
# Every dependency must be there: a missing one fails the configure step
# instead of silently dropping its tests. SHOAL_REDUCED=1 allows a reduced
# run (no MPI, libfabric, hwloc, CUDA toolkit or namespaces), said loudly.
if [ "${SHOAL_REDUCED:-0}" = 1 ]; then
  echo "run_tests.sh: REDUCED run requested (SHOAL_REDUCED=1): missing dependencies and namespaces are allowed"
  export SHOAL_NETNS_ALLOW_LOOPBACK=1
  bash scripts/build.sh -DSHOAL_REQUIRE_DEPS=OFF
else
  bash scripts/build.sh -DSHOAL_REQUIRE_DEPS=ON
fi
phase "build"
# The library also builds without CUDA (host memory only), as on a machine
# without the toolkit. A compile check: unoptimized and without debug info it
# takes half the time (47 s against 89 s here).
cmake -S . -B build-nocuda -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g0" \
  -DCMAKE_C_FLAGS_DEBUG="-O0 -g0" -DSHOAL_WITH_CUDA=OFF -DSHOAL_BUILD_TESTS=OFF -DSHOAL_BUILD_BENCH=OFF >/dev/null
cmake --build build-nocuda -j"$(nproc)" --target nccl
phase "build without CUDA"
export NCCL_SOCKET_IFNAME=lo FI_TCP_IFACE=lo
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
# As many tests at once as there are cores (the multi-node ones alone: RUN_SERIAL).
(cd build && ctest --output-on-failure --no-tests=error --timeout 900 -j"$(nproc)" "$@") || status=$?
phase "tests"
# The same code under sanitizers: ASan + UBSan over the unit, api, mp and
# sim tests, TSan over the engine, transports, bootstrap and threaded api
# tests (scripts/sanitize.sh). A report fails the run.
sanitizers=0
if [ "${SHOAL_SANITIZERS:-1}" = 1 ]; then
  bash scripts/sanitize.sh address || sanitizers=1
  phase "ASan+UBSan build and tests"
  bash scripts/sanitize.sh thread || sanitizers=1
  phase "TSan build and tests"
else
  echo "run_tests.sh: sanitizer runs skipped (SHOAL_SANITIZERS=0)"
fi
# Per label, how many tests this build has: a shrunk run shows here.
echo "Tests per label in this build:"
for label in $(cd build && ctest --print-labels | sed -n 's/^  //p'); do
  printf '  %-10s %s\n' "$label" "$(cd build && ctest -N -L "^${label}\$" | sed -n 's/^Total Tests: //p')"
done
echo "Wall time per phase:"
printf '%s\n' "${timings[@]}"
printf '  %-28s %5ss\n' "all" $((SECONDS - start))
[ "$sanitizers" = 0 ] || echo "run_tests.sh: a sanitizer run failed (see above)"
[ "$status" = 0 ] && [ "$sanitizers" = 0 ]
