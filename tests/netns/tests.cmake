# Emulated multi-node runs (label "netns"), included from tests/CMakeLists.txt.
# Each test runs tests/netns/cluster.sh: N "nodes" as network namespaces on a
# bridge, L ranks per node under one mpirun, NCCL_HOSTID=node<k> per node.
# Where namespaces cannot be made (not root, no CAP_NET_ADMIN, no iproute2)
# the same tests run on loopback with NCCL_HOSTID grouping and say so; the
# tests that need real links (rate limit, link down, cleanup) then report
# "skipped" (exit 77). Needs the MPI-built perf binaries, mpirun and bash.

# examples/elastic_train across three node namespaces (elastic_netns.sh, no
# MPI: the trainer forks its ranks and each enters its node's namespace).
# Node 1's ranks are SIGKILLed at step 8, two new ranks on node2 grow in at
# step 16; passes only if --check matches the single-process losses, every
# node's link carried traffic both ways, and (--check-cleanup) neither the
# run nor a second one ended by SIGTERM mid-run leaves a namespace behind.
find_program(SHOAL_BASH bash)
if(TARGET elastic_train AND SHOAL_BASH)
  add_test(NAME netns.elastic_train.3nodes
    COMMAND ${SHOAL_BASH} ${CMAKE_CURRENT_LIST_DIR}/elastic_netns.sh --check-cleanup --timeout 40
      -- $<TARGET_FILE:elastic_train> --check)
  set_tests_properties(netns.elastic_train.3nodes PROPERTIES
    LABELS netns TIMEOUT 60 SKIP_RETURN_CODE 77
    ENVIRONMENT_MODIFICATION "NCCL_SOCKET_IFNAME=unset:;FI_TCP_IFACE=unset:;NCCL_HOSTID=unset:"
    FAIL_REGULAR_EXPRESSION "MISMATCH| failed: |LEFT BEHIND")
endif()

if(NOT TARGET all_reduce_perf OR NOT MPI_CXX_FOUND OR NOT MPIEXEC_EXECUTABLE)
  return()
endif()
find_program(SHOAL_BASH bash)
if(NOT SHOAL_BASH)
  return()
endif()

set(SHOAL_CLUSTER ${CMAKE_CURRENT_LIST_DIR}/cluster.sh)
set(SHOAL_NETNS_FAIL_REGEX "FAILED|NCCL failure|Test timeout|COMMAND timed out")
# The harness picks each node's interface and host id; a global setting in
# the caller's environment (e.g. NCCL_SOCKET_IFNAME=lo for the mpi tests)
# would be forwarded to every rank and override that.
set(SHOAL_NETNS_ENV_MOD "NCCL_SOCKET_IFNAME=unset:;FI_TCP_IFACE=unset:;NCCL_HOSTID=unset:")

# shoal_add_netns_perf_test(<test name> <perf target> <nodes> <ranks per node>
#                           [ENV VAR=value...] ARGS <perf args>...)
# ENV variables reach every rank (cluster.sh forwards NCCL_*, SHOAL_*, FI_*),
# e.g. ENV SHOAL_ALGO=<name> to pin an algorithm.
function(shoal_add_netns_perf_test name perf nodes rpn)
  cmake_parse_arguments(T "" "" "ENV;ARGS" ${ARGN})
  add_test(NAME ${name}
    COMMAND ${SHOAL_BASH} ${SHOAL_CLUSTER} --nodes ${nodes} --ranks-per-node ${rpn} --timeout 55
      -- $<TARGET_FILE:${perf}> ${T_ARGS})
  set_tests_properties(${name} PROPERTIES
    LABELS netns
    TIMEOUT 60
    SKIP_RETURN_CODE 77
    ENVIRONMENT "${T_ENV}"
    ENVIRONMENT_MODIFICATION "${SHOAL_NETNS_ENV_MOD}"
    FAIL_REGULAR_EXPRESSION "${SHOAL_NETNS_FAIL_REGEX}")
endfunction()

# Every collective with the data check (-c 1) on 2x2 and 3x2 nodes, up to
# 1 MiB. The tuner picks the algorithm (hierarchical or recursive doubling
# across these nodes).
set(_small -b 8 -e 1M -f 16 -c 1 -n 5 -w 1)
foreach(shape 2x2 3x2)
  string(REPLACE "x" ";" _nl ${shape})
  list(GET _nl 0 _nodes)
  list(GET _nl 1 _rpn)
  shoal_add_netns_perf_test(netns.all_reduce.${shape} all_reduce_perf ${_nodes} ${_rpn} ARGS ${_small})
  shoal_add_netns_perf_test(netns.all_gather.${shape} all_gather_perf ${_nodes} ${_rpn} ARGS ${_small})
  shoal_add_netns_perf_test(netns.reduce_scatter.${shape} reduce_scatter_perf ${_nodes} ${_rpn}
    ARGS ${_small})
  shoal_add_netns_perf_test(netns.broadcast.${shape} broadcast_perf ${_nodes} ${_rpn}
    ARGS ${_small} -r -1)
  shoal_add_netns_perf_test(netns.alltoall.${shape} alltoall_perf ${_nodes} ${_rpn} ARGS ${_small})
endforeach()

# Flat, hierarchical and the latency algorithms (recursive doubling, Bruck)
# forced, for the collectives that have them; 3x2 is not a power of two.
foreach(shape 2x2 3x2)
  string(REPLACE "x" ";" _nl ${shape})
  list(GET _nl 0 _nodes)
  list(GET _nl 1 _rpn)
  foreach(algo ring hierarchical)
    shoal_add_netns_perf_test(netns.all_reduce.${shape}.${algo} all_reduce_perf ${_nodes} ${_rpn}
      ENV SHOAL_ALGO=${algo} ARGS ${_small})
    shoal_add_netns_perf_test(netns.all_gather.${shape}.${algo} all_gather_perf ${_nodes} ${_rpn}
      ENV SHOAL_ALGO=${algo} ARGS ${_small})
    shoal_add_netns_perf_test(netns.reduce_scatter.${shape}.${algo} reduce_scatter_perf ${_nodes} ${_rpn}
      ENV SHOAL_ALGO=${algo} ARGS ${_small})
  endforeach()
  shoal_add_netns_perf_test(netns.all_reduce.${shape}.recursive_doubling all_reduce_perf ${_nodes}
    ${_rpn} ENV SHOAL_ALGO=recursive_doubling ARGS ${_small})
  shoal_add_netns_perf_test(netns.all_gather.${shape}.bruck all_gather_perf ${_nodes} ${_rpn}
    ENV SHOAL_ALGO=bruck ARGS ${_small})
  shoal_add_netns_perf_test(netns.reduce_scatter.${shape}.bruck reduce_scatter_perf ${_nodes} ${_rpn}
    ENV SHOAL_ALGO=bruck ARGS ${_small})
endforeach()

# Each node's link limited to 200 Mbit/s each way by tbf.
# The measured bandwidth must stay within the limit and reach a quarter of it.
add_test(NAME netns.all_reduce.2x1.rate_limited
  COMMAND ${SHOAL_BASH} ${CMAKE_CURRENT_LIST_DIR}/check_rate.sh ${SHOAL_CLUSTER}
    $<TARGET_FILE:all_reduce_perf> 200)
set_tests_properties(netns.all_reduce.2x1.rate_limited PROPERTIES
  LABELS netns TIMEOUT 60 SKIP_RETURN_CODE 77
  ENVIRONMENT_MODIFICATION "${SHOAL_NETNS_ENV_MOD}"
  FAIL_REGULAR_EXPRESSION "${SHOAL_NETNS_FAIL_REGEX}")

# The loopback fallback itself, forced: what runs where namespaces cannot.
add_test(NAME netns.all_reduce.2x2.loopback_fallback
  COMMAND ${SHOAL_BASH} ${SHOAL_CLUSTER} --loopback --nodes 2 --ranks-per-node 2 --timeout 55
    -- $<TARGET_FILE:all_reduce_perf> ${_small})
set_tests_properties(netns.all_reduce.2x2.loopback_fallback PROPERTIES
  LABELS netns TIMEOUT 60
  ENVIRONMENT_MODIFICATION "${SHOAL_NETNS_ENV_MOD}"
  FAIL_REGULAR_EXPRESSION "${SHOAL_NETNS_FAIL_REGEX}")

# The harness leaves no namespace, process, folder or interface behind, when
# COMMAND fails and when it is interrupted.
add_test(NAME netns.harness_cleanup
  COMMAND ${SHOAL_BASH} ${CMAKE_CURRENT_LIST_DIR}/check_cleanup.sh ${SHOAL_CLUSTER})
set_tests_properties(netns.harness_cleanup PROPERTIES
  LABELS netns TIMEOUT 60 SKIP_RETURN_CODE 77)

# A node's link goes down in the middle of back-to-back allreduces (node 1 of
# 2x2, 4 s after every rank completed its first one, however long start-up
# took; no-progress deadline 5 s). cluster.sh prints one line per rank
# and exits 0 only if every rank ended with an error within 15 s of the cut:
#   .no_hang          any error will do
#   .names_lost_peer  each rank's error also names a rank beyond the cut
add_executable(netns_link_probe ${CMAKE_CURRENT_LIST_DIR}/link_probe.cc)
target_link_libraries(netns_link_probe PRIVATE nccl MPI::MPI_CXX)
foreach(require no_hang names_lost_peer)
  if(require STREQUAL no_hang)
    set(_require error)
  else()
    set(_require named)
  endif()
  add_test(NAME netns.link_down.2x2.${require}
    COMMAND ${SHOAL_BASH} ${SHOAL_CLUSTER} --nodes 2 --ranks-per-node 2 --timeout 55
      --link-down-after 4 1 --link-down-wait 15 --link-down-require ${_require}
      -- $<TARGET_FILE:netns_link_probe> 40 1048576)
  set_tests_properties(netns.link_down.2x2.${require} PROPERTIES
    LABELS netns TIMEOUT 60 SKIP_RETURN_CODE 77
    ENVIRONMENT "SHOAL_PROGRESS_TIMEOUT_MS=5000"
    ENVIRONMENT_MODIFICATION "${SHOAL_NETNS_ENV_MOD}")
endforeach()
# A rank on the cut node that waits on a same-node peer learns that peer's
# cause through the shm segment (the store is across the cut), so it too
# names a rank beyond the cut.

# The same cut while every communicator is idle (node 1 of 2x2, 4 s after
# every rank finished five allreduces; default deadlines): nobody calls but
# ncclCommGetAsyncError, every 100 ms as PyTorch's watchdog does, and every
# rank must see an error naming a rank beyond the cut within 40 s. The idle
# check (SHOAL_IDLE_CHECK_MS) calls a socket dead once the peer's host has
# answered nothing, not even keepalive probes, for 25 s.
add_test(NAME netns.link_down.2x2.idle
  COMMAND ${SHOAL_BASH} ${SHOAL_CLUSTER} --nodes 2 --ranks-per-node 2 --timeout 85
    --link-down-after 4 1 --link-down-wait 40 --link-down-require named
    -- $<TARGET_FILE:netns_link_probe> --idle 60 1048576)
set_tests_properties(netns.link_down.2x2.idle PROPERTIES
  LABELS netns TIMEOUT 90 SKIP_RETURN_CODE 77
  ENVIRONMENT_MODIFICATION "${SHOAL_NETNS_ENV_MOD}")

# Elastic communicators: the same cut in the middle of back-to-back
# allreduces, but node 0's ranks (where the bootstrap root lives) survive it:
# they shrink around node 1's ranks (ncclCommShrink, NCCL_SHRINK_ABORT) and
# run checked allreduces on the smaller communicator; node 1's ranks fail.
# No-progress deadline 5 s, as above (docs/nccl-compat.md, Elastic
# communicators, says what finds the cut with the defaults).
add_test(NAME netns.link_down.2x2.shrink
  COMMAND ${SHOAL_BASH} ${SHOAL_CLUSTER} --nodes 2 --ranks-per-node 2 --timeout 55
    --link-down-after 4 1 --link-down-wait 25 --link-down-require survive
    -- $<TARGET_FILE:netns_link_probe> --shrink 40 1048576)
set_tests_properties(netns.link_down.2x2.shrink PROPERTIES
  LABELS netns TIMEOUT 60 SKIP_RETURN_CODE 77
  ENVIRONMENT "SHOAL_PROGRESS_TIMEOUT_MS=5000"
  ENVIRONMENT_MODIFICATION "${SHOAL_NETNS_ENV_MOD}")
# The same with default settings: the stalled allreduce finds the silent host
# (Engine::checkStalledPeers, ~25 s of silence) long before the no-progress
# deadline (300 s); the survivors must be through within 45 s of the cut.
add_test(NAME netns.link_down.2x2.shrink.defaults
  COMMAND ${SHOAL_BASH} ${SHOAL_CLUSTER} --nodes 2 --ranks-per-node 2 --timeout 85
    --link-down-after 4 1 --link-down-wait 45 --link-down-require survive
    -- $<TARGET_FILE:netns_link_probe> --shrink 80 1048576)
set_tests_properties(netns.link_down.2x2.shrink.defaults PROPERTIES
  LABELS netns TIMEOUT 90 SKIP_RETURN_CODE 77
  ENVIRONMENT_MODIFICATION "${SHOAL_NETNS_ENV_MOD};SHOAL_PROGRESS_TIMEOUT_MS=unset:")

# Multi-rail: two links per node (two veth pairs, two bridges); the ofi
# transport over libfabric's tcp;ofi_rxm stripes channels over one endpoint
# per rail, so each rail must carry at least a third of a node's bytes.
add_test(NAME netns.ofi.two_rails.2x1
  COMMAND ${SHOAL_BASH} ${CMAKE_CURRENT_LIST_DIR}/check_rails.sh ${SHOAL_CLUSTER} 33
    --nodes 2 --ranks-per-node 1 --rails 2 --timeout 55
    -- $<TARGET_FILE:all_reduce_perf> -b 4M -e 16M -f 4 -c 1 -n 3 -w 1)
set_tests_properties(netns.ofi.two_rails.2x1 PROPERTIES
  LABELS netns TIMEOUT 60 SKIP_RETURN_CODE 77
  ENVIRONMENT "SHOAL_TRANSPORT=ofi;FI_PROVIDER=tcp\\;ofi_rxm"
  ENVIRONMENT_MODIFICATION "${SHOAL_NETNS_ENV_MOD}"
  FAIL_REGULAR_EXPRESSION "${SHOAL_NETNS_FAIL_REGEX}")

# libfabric between the emulated nodes (NCCL_NET=Libfabric: ofi for peers on
# other hosts, shm inside a node), every collective's data checked, tuner's
# choice and hierarchical forced. (ENVIRONMENT is set here, not through
# shoal_add_netns_perf_test, whose argument parsing would split the
# provider list at its ';'.)
foreach(variant tuner hierarchical)
  set(_env "NCCL_NET=Libfabric;FI_PROVIDER=tcp\\;ofi_rxm")
  if(variant STREQUAL hierarchical)
    string(APPEND _env ";SHOAL_ALGO=hierarchical")
  endif()
  foreach(op all_reduce all_gather reduce_scatter)
    set(_name netns.ofi.${op}.2x2.${variant})
    add_test(NAME ${_name}
      COMMAND ${SHOAL_BASH} ${SHOAL_CLUSTER} --nodes 2 --ranks-per-node 2 --timeout 55
        -- $<TARGET_FILE:${op}_perf> -b 8 -e 1M -f 32 -c 1 -n 3 -w 1)
    set_tests_properties(${_name} PROPERTIES
      LABELS netns TIMEOUT 60 SKIP_RETURN_CODE 77
      ENVIRONMENT "${_env}"
      ENVIRONMENT_MODIFICATION "${SHOAL_NETNS_ENV_MOD}"
      FAIL_REGULAR_EXPRESSION "${SHOAL_NETNS_FAIL_REGEX}")
  endforeach()
endforeach()
