#!/usr/bin/env bash
# Builds Shoal with sanitizers and runs the tests each one is for:
#   address  ASan + UBSan (build-asan): the unit, api, mp and sim (in-process
#            simulation) tests; where the CUDA toolkit is found, also the
#            device-memory tests on the driver stand-in (device, stream and
#            window plans, graph capture, cuda_ipc between forked processes,
#            two GPUs, the kernels' loader, ofi with device memory), all but
#            the soak tests (ASan's quarantine grows the RSS they bound).
#   thread   TSan (build-tsan): the engine, transport conformance, bootstrap
#            and threaded api tests (ranks as threads, nonblocking init,
#            abort from another thread); where the CUDA toolkit is found,
#            also the graph-capture and two-GPU tests on the driver stand-in
#            (host functions, user-object destructors and the engine's
#            replays run on threads of their own).
# Any report fails the test that produced it: UBSan does not recover, ASan and
# TSan exit non-zero. Only the test executables these runs need are built.
# Usage: scripts/sanitize.sh address|thread [extra ctest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/sanitize.sh address|thread [ctest args]}
shift
jobs=$(nproc)

case "$kind" in
  address)
    dir=build-asan
    flags=address,undefined
    targets="unit_tests core_unit_tests net_unit_tests tuner_tests plan_tests transport_tests
             ofi_transport_tests abi_layout_test api_behaviour_tests mp_tests mp_check_mode_tests
             mp_env_tests ofi_mp_tests sim_tests"
    only=''  # every test of these executables
    skip=''
    cuda=AUTO
    cudaTargets="cudafake_device_tests cudafake_graph_tests cudafake_two_gpus_tests cudafake_cuda_ipc_tests
                 cudafake_stream_ring_tests cudafake_reduce_tests cudafake_selftest cudafake_no_cuda_test
                 cudafake_ofi_device_tests"
    # Forked ranks report leaks in their own exit; a crash report names the frames.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1}
    export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
    ;;
  thread)
    dir=build-tsan
    flags=thread
    targets="core_unit_tests net_unit_tests transport_tests api_behaviour_tests"
    # core: Status, params, config and the engine on hand-made plans; net:
    # sockets and the bootstrap; transport: conformance over shm, tcp and the
    # loopback; api: the cases that run ranks as threads or touch a
    # communicator from a second thread.
    only='api_behaviour_tests:thread|nonblocking|ncclCommAbort|detached'
    skip=''
    cuda=AUTO
    cudaTargets="cudafake_graph_tests cudafake_two_gpus_tests"
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
    ;;
  *)
    echo "sanitize.sh: unknown kind '$kind' (address or thread)" >&2
    exit 2
    ;;
esac

mkdir -p "$dir"
# -O1 -g1: quicker to build than -O2 -g; reports keep file and line.
if ! cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
     -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DSHOAL_SANITIZE="$flags" \
     -DSHOAL_WITH_CUDA="$cuda" -DSHOAL_BUILD_BENCH=OFF -DSHOAL_NETNS_TESTS=OFF \
     -DSHOAL_REQUIRE_DEPS=ON >"$dir/configure.log" 2>&1; then
  cat "$dir/configure.log"
  exit 1
fi
# The CUDA stand-in's tests exist only where the toolkit was found.
# (the list read whole first: grep -q quitting early would fail the pipe)
known=$(cmake --build "$dir" --target help)
if [ -n "$cudaTargets" ] && grep -qw "${cudaTargets%% *}" <<<"$known"; then
  targets="$targets $cudaTargets"
elif [ -n "$cudaTargets" ]; then
  echo "sanitize.sh: no CUDA toolkit: the CUDA stand-in's tests are not run under $kind"
fi
# shellcheck disable=SC2086
cmake --build "$dir" -j"$jobs" --target $targets

export NCCL_SOCKET_IFNAME=lo FI_TCP_IFACE=lo
cd "$dir"
# The tests of the executables built here, by number (ctest -I): a label
# would also name benchmarks, examples and probes this build does not make.
numbers=$(ctest --show-only=json-v1 | TARGETS="$targets" ONLY="$only" SKIP="$skip" python3 -c '
import json, os, re, sys
targets = set(os.environ["TARGETS"].split())
exe, _, pattern = os.environ["ONLY"].partition(":")
picked = []
for number, test in enumerate(json.load(sys.stdin)["tests"], 1):
    binary = os.path.basename((test.get("command") or [""])[0])
    if binary not in targets:
        continue
    if binary == exe and not re.search(pattern, test["name"], re.I):
        continue
    if os.environ["SKIP"] and re.search(os.environ["SKIP"], test["name"]):
        continue
    picked.append(str(number))
print(",".join(picked))')
if [ -z "$numbers" ]; then
  echo "sanitize.sh: no tests selected" >&2
  exit 1
fi
echo "sanitize.sh: $kind ($flags): $(tr ',' '\n' <<<"$numbers" | wc -l) tests"
ctest --output-on-failure --no-tests=error --timeout 900 -j"$jobs" -I "0,0,0,$numbers" "$@"
