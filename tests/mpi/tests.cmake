# End-to-end runs of the nccl-tests-compatible benchmarks (bench/perf);
# included from tests/CMakeLists.txt. Each runs one perf binary with data
# checking on; the binary exits non-zero on any wrong element, NCCL error or
# timeout, and FAIL_REGULAR_EXPRESSION catches a FAILED footer should a
# launcher ever lose the exit status.
#   perf.*   label "sim": N ranks as threads of one process (-t N), no MPI
#   mpi.*    label "mpi": one rank per process under mpirun
if(NOT TARGET all_reduce_perf)
  return()
endif()

set(SHOAL_PERF_FAIL_REGEX "FAILED|NCCL failure|CUDA failure|Test timeout")

# Thread mode needs no MPI and runs wherever the benchmarks are built.
# shoal_add_thread_perf_test(<test name> <perf target> <nthreads> <perf args>...)
function(shoal_add_thread_perf_test name perf nthreads)
  add_test(NAME ${name} COMMAND $<TARGET_FILE:${perf}> -t ${nthreads} ${ARGN})
  set_tests_properties(${name} PROPERTIES
    LABELS sim
    TIMEOUT 120
    ENVIRONMENT "NCCL_SOCKET_IFNAME=lo;FI_TCP_IFACE=lo"
    FAIL_REGULAR_EXPRESSION "${SHOAL_PERF_FAIL_REGEX}")
endfunction()

shoal_add_thread_perf_test(perf.all_reduce.t4 all_reduce_perf 4 -b 8 -e 1M -f 4 -c 1)
shoal_add_thread_perf_test(perf.all_reduce.t3.all_ops_types all_reduce_perf 3
  -b 8 -e 64K -f 8 -c 1 -n 5 -o all -d all)
# PreMulSum ops created and destroyed inside aggregated groups, registered and
# misaligned buffers.
shoal_add_thread_perf_test(perf.all_reduce.t2.grouped_mulsum all_reduce_perf 2
  -b 1K -e 64K -f 4 -c 1 -n 5 -m 4 -R 1 -u 1 -o mulsum -d bfloat16)
shoal_add_thread_perf_test(perf.all_gather.t4 all_gather_perf 4 -b 8 -e 256K -f 4 -c 1)
shoal_add_thread_perf_test(perf.reduce_scatter.t4 reduce_scatter_perf 4 -b 8 -e 256K -f 4 -c 1)
shoal_add_thread_perf_test(perf.broadcast.t3 broadcast_perf 3 -b 8 -e 256K -f 4 -c 1 -r -1)
shoal_add_thread_perf_test(perf.reduce.t3 reduce_perf 3 -b 8 -e 256K -f 4 -c 1 -r -1)
shoal_add_thread_perf_test(perf.alltoall.t4 alltoall_perf 4 -b 8 -e 256K -f 4 -c 1)
shoal_add_thread_perf_test(perf.sendrecv.t4 sendrecv_perf 4 -b 8 -e 256K -f 4 -c 1)
shoal_add_thread_perf_test(perf.gather.t3 gather_perf 3 -b 8 -e 256K -f 4 -c 1 -r -1)
shoal_add_thread_perf_test(perf.scatter.t3 scatter_perf 3 -b 8 -e 256K -f 4 -c 1 -r -1)
# Ranks as forked processes without MPI (--procs): the launcher of GPU machines.
shoal_add_thread_perf_test(perf.all_reduce.procs3 all_reduce_perf 1 --procs 3 -b 8 -e 1M -f 4 -c 1)
shoal_add_thread_perf_test(perf.all_gather.procs2x2 all_gather_perf 2 --procs 2 -b 8 -e 256K -f 4 -c 1)

# The perf binaries speak MPI only when built with it (SHOAL_PERF_MPI);
# without it, mpirun would start N unrelated one-rank jobs.
if(NOT MPI_CXX_FOUND OR NOT MPIEXEC_EXECUTABLE)
  return()
endif()

# Open MPI 4.1 as root needs --allow-run-as-root, and --oversubscribe above
# the core count; everything stays on the loopback interface.
set(SHOAL_MPIRUN ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
  --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo
  -x NCCL_SOCKET_IFNAME=lo -x FI_TCP_IFACE=lo)

# shoal_add_mpi_perf_test(<test name> <perf target> <nranks> <perf args>...)
function(shoal_add_mpi_perf_test name perf nranks)
  add_test(NAME ${name}
    COMMAND ${SHOAL_MPIRUN} -np ${nranks} $<TARGET_FILE:${perf}> ${ARGN})
  set_tests_properties(${name} PROPERTIES
    LABELS mpi
    TIMEOUT 120
    FAIL_REGULAR_EXPRESSION "${SHOAL_PERF_FAIL_REGEX}")
endfunction()

shoal_add_mpi_perf_test(mpi.all_reduce.np2 all_reduce_perf 2 -b 8 -e 1M -f 4 -c 1)
shoal_add_mpi_perf_test(mpi.all_reduce.np3 all_reduce_perf 3 -b 8 -e 1M -f 4 -c 1)
shoal_add_mpi_perf_test(mpi.all_reduce.np2.all_ops_types all_reduce_perf 2
  -b 8 -e 64K -f 8 -c 1 -n 5 -o all -d all)
shoal_add_mpi_perf_test(mpi.all_gather.np2 all_gather_perf 2 -b 8 -e 256K -f 4 -c 1)
shoal_add_mpi_perf_test(mpi.reduce_scatter.np2 reduce_scatter_perf 2 -b 8 -e 256K -f 4 -c 1)
shoal_add_mpi_perf_test(mpi.broadcast.np2 broadcast_perf 2 -b 8 -e 256K -f 4 -c 1 -r -1)
shoal_add_mpi_perf_test(mpi.reduce.np2 reduce_perf 2 -b 8 -e 256K -f 4 -c 1 -r -1)
shoal_add_mpi_perf_test(mpi.alltoall.np2 alltoall_perf 2 -b 8 -e 256K -f 4 -c 1)
shoal_add_mpi_perf_test(mpi.sendrecv.np2 sendrecv_perf 2 -b 8 -e 256K -f 4 -c 1)
shoal_add_mpi_perf_test(mpi.gather.np2 gather_perf 2 -b 8 -e 256K -f 4 -c 1 -r -1)
shoal_add_mpi_perf_test(mpi.scatter.np2 scatter_perf 2 -b 8 -e 256K -f 4 -c 1 -r -1)
