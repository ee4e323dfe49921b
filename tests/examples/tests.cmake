# End-to-end runs of the example trainers (examples/); included from
# tests/CMakeLists.txt. Each runs one example with --check: the example also
# trains the single-process reference on the same global batches and exits
# non-zero unless the loss of every step and the final parameters match it
# within the tolerance stated in examples/common/model.h, the parameters of a
# data-parallel group are bit-identical on every rank after every step, and
# (ZeRO stage 3) the peak parameter memory per rank is at most 1/N of the
# model plus one layer.
#   examples.*       label "sim": N ranks as threads of one process (-t N)
#   examples.mpi.*   label "mpi": one rank per process under mpirun
if(NOT TARGET dp_train)
  return()
endif()

# A lost exit status must not hide a failed check or an NCCL error.
set(SHOAL_EXAMPLES_FAIL_REGEX "MISMATCH| failed: ")

# shoal_add_example_test(<test name> <example target> <nthreads> <example args>...)
function(shoal_add_example_test name example nthreads)
  add_test(NAME ${name} COMMAND $<TARGET_FILE:${example}> -t ${nthreads} --check ${ARGN})
  set_tests_properties(${name} PROPERTIES
    LABELS "sim;examples"
    TIMEOUT 60
    ENVIRONMENT "NCCL_SOCKET_IFNAME=lo;FI_TCP_IFACE=lo"
    FAIL_REGULAR_EXPRESSION "${SHOAL_EXAMPLES_FAIL_REGEX}")
endfunction()

foreach(ranks 1 2 3 4)
  # Small buckets, so that several AllReduces overlap the backward pass.
  shoal_add_example_test(examples.dp_train.t${ranks} dp_train ${ranks} --bucket-mb 0.01)
  foreach(stage 1 2 3)
    shoal_add_example_test(examples.zero_train.stage${stage}.t${ranks} zero_train ${ranks}
      --stage ${stage})
  endforeach()
  shoal_add_example_test(examples.tp_train.t${ranks} tp_train ${ranks})
endforeach()
shoal_add_example_test(examples.dp_train.t2.no_overlap dp_train 2 --bucket-mb 0.01 --overlap off)
shoal_add_example_test(examples.dp_train.t2.host_stream dp_train 2 --bucket-mb 0.01 --overlap stream)
shoal_add_example_test(examples.dp_train.t3.one_bucket dp_train 3)
shoal_add_example_test(examples.tp_train.t2.five_layers tp_train 2 --layers 5)
# One stage per rank needs a layer per stage: four ranks train four layers.
shoal_add_example_test(examples.pp_train.t1 pp_train 1)
shoal_add_example_test(examples.pp_train.t2 pp_train 2)
shoal_add_example_test(examples.pp_train.t3 pp_train 3)
shoal_add_example_test(examples.pp_train.t3.m6 pp_train 3 --microbatches 6)
shoal_add_example_test(examples.pp_train.t4 pp_train 4 --layers 4)

# The examples speak MPI only when built with it; without it, mpirun would
# start N unrelated one-rank jobs.
if(NOT MPI_CXX_FOUND OR NOT MPIEXEC_EXECUTABLE)
  return()
endif()

# Open MPI 4.1 as root needs --allow-run-as-root, and --oversubscribe above
# the core count; everything stays on the loopback interface.
set(SHOAL_EXAMPLES_MPIRUN ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
  --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo
  -x NCCL_SOCKET_IFNAME=lo -x FI_TCP_IFACE=lo)

# shoal_add_mpi_example_test(<test name> <example target> <nprocesses> <example args>...)
function(shoal_add_mpi_example_test name example nprocesses)
  add_test(NAME ${name}
    COMMAND ${SHOAL_EXAMPLES_MPIRUN} -np ${nprocesses} $<TARGET_FILE:${example}> --check ${ARGN})
  set_tests_properties(${name} PROPERTIES
    LABELS "mpi;examples"
    TIMEOUT 60
    FAIL_REGULAR_EXPRESSION "${SHOAL_EXAMPLES_FAIL_REGEX}")
endfunction()

foreach(ranks 2 3)
  shoal_add_mpi_example_test(examples.mpi.dp_train.np${ranks} dp_train ${ranks} --bucket-mb 0.01)
  shoal_add_mpi_example_test(examples.mpi.zero_train.stage3.np${ranks} zero_train ${ranks} --stage 3)
  shoal_add_mpi_example_test(examples.mpi.tp_train.np${ranks} tp_train ${ranks})
  shoal_add_mpi_example_test(examples.mpi.pp_train.np${ranks} pp_train ${ranks})
endforeach()
shoal_add_mpi_example_test(examples.mpi.dp_train.np2.host_stream dp_train 2 --bucket-mb 0.01
  --overlap stream)
shoal_add_mpi_example_test(examples.mpi.zero_train.stage1.np2 zero_train 2 --stage 1)
shoal_add_mpi_example_test(examples.mpi.zero_train.stage2.np2 zero_train 2 --stage 2)
# Processes times threads: four ranks as two processes of two threads.
shoal_add_mpi_example_test(examples.mpi.zero_train.stage3.np2.t2 zero_train 2 --stage 3 -t 2)
shoal_add_mpi_example_test(examples.mpi.pp_train.np2.t2 pp_train 2 -t 2 --layers 4)

# elastic_train: 2 emulated nodes x 2 rank processes (forked by the example,
# NCCL_HOSTID node0/node1, shm within a node, tcp between); node 1's ranks are
# SIGKILLed mid-AllReduce at step 8, the survivors shrink and go on, two new
# processes on node2 grow in at step 16; --check compares every step's loss and
# the final parameters with the single-process run.
add_test(NAME examples.elastic_train COMMAND $<TARGET_FILE:elastic_train> --check)
set_tests_properties(examples.elastic_train PROPERTIES
  LABELS "mp;examples"
  TIMEOUT 120
  ENVIRONMENT "NCCL_SOCKET_IFNAME=lo;FI_TCP_IFACE=lo"
  FAIL_REGULAR_EXPRESSION "${SHOAL_EXAMPLES_FAIL_REGEX}")
