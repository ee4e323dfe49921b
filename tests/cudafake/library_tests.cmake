# The library on device buffers, against the driver stand-in (label cudafake;
# docs/cuda.md). Included after tests.cmake, which builds shoal_cudafake.
#   cudafake_device_tests  links the stand-in, so the process "uses CUDA"
#   cudafake_no_cuda_test  does not: the library must never load it
# A fixed path for the stand-in (compiled into the tests that name it).
set(SHOAL_CUDAFAKE_DIR ${PROJECT_BINARY_DIR}/tests/cudafake)
set_target_properties(shoal_cudafake PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${SHOAL_CUDAFAKE_DIR})
set(SHOAL_CUDAFAKE_LIB ${SHOAL_CUDAFAKE_DIR}/libshoal_cudafake.so)

# A test binary of the library on the stand-in (which it links, and whose
# path it is given), each test case a ctest test labelled cudafake.
# catch_discover_tests passes one ENVIRONMENT entry intact (a second becomes a
# property name): each test sets the rest itself, from the definitions.
function(shoal_cudafake_tests name timeout)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE shoal_static shoal_cudafake shoal_cuda_headers shoal_catch_main
    Catch2::Catch2)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE SHOAL_CUDAFAKE_LIB="${SHOAL_CUDAFAKE_LIB}")
  catch_discover_tests(${name} EXTRA_ARGS -w NoTests PROPERTIES LABELS cudafake TIMEOUT ${timeout}
    ENVIRONMENT "NCCL_SOCKET_IFNAME=lo")
endfunction()

shoal_cudafake_tests(cudafake_device_tests 300 ${CMAKE_CURRENT_LIST_DIR}/device_collectives_test.cc
  ${PROJECT_SOURCE_DIR}/tests/support/mp_harness.cc)
# Collectives captured into CUDA graphs and replayed by the stand-in's launches.
shoal_cudafake_tests(cudafake_graph_tests 240 ${CMAKE_CURRENT_LIST_DIR}/graph_capture_test.cc
  ${PROJECT_SOURCE_DIR}/tests/support/mp_harness.cc)
# Ranks on two GPUs of one process: the stand-in's device count is set before
# its first cuInit, so they have a binary of their own.
shoal_cudafake_tests(cudafake_two_gpus_tests 120 ${CMAKE_CURRENT_LIST_DIR}/two_gpus_test.cc
  ${PROJECT_SOURCE_DIR}/tests/support/mp_harness.cc)

# The device path's long-running behaviour: threads, fds, memory, streams
# and device allocations flat over hundreds of rounds (the soak driver's
# resource sampling).
# (The driver brings the fork harness.)
shoal_cudafake_tests(cudafake_soak_tests 300 ${CMAKE_CURRENT_LIST_DIR}/device_soak_test.cc)
target_link_libraries(cudafake_soak_tests PRIVATE shoal_soak_driver)

add_executable(cudafake_no_cuda_test ${CMAKE_CURRENT_LIST_DIR}/no_cuda_test.cc)
target_link_libraries(cudafake_no_cuda_test PRIVATE shoal_static shoal_catch_main Catch2::Catch2)
add_dependencies(cudafake_no_cuda_test shoal_cudafake)
catch_discover_tests(cudafake_no_cuda_test EXTRA_ARGS -w NoTests PROPERTIES LABELS cudafake TIMEOUT 120
  ENVIRONMENT "NCCL_SOCKET_IFNAME=lo")
target_compile_definitions(cudafake_no_cuda_test PRIVATE SHOAL_CUDAFAKE_LIB="${SHOAL_CUDAFAKE_LIB}"
  SHOAL_NO_CUDA_LOG="${SHOAL_CUDAFAKE_DIR}/no_cuda_test.log")

# The device reduction kernels through cuda::DeviceReducer on the stand-in
# (each test case in its own process: the reducer is cached per context).
# -ffp-contract=off: the test computes expected values with float arithmetic.
shoal_cudafake_tests(cudafake_reduce_tests 120 ${CMAKE_CURRENT_LIST_DIR}/device_reduce_test.cc)
target_compile_options(cudafake_reduce_tests PRIVATE -fno-fast-math -ffp-contract=off)

# The PTX nvcc produced for the reduction kernels: all 72 declared, no fma and
# no floating add/sub/mul without a rounding modifier (premulsum and avg stay
# two roundings, as the host reducer). Two negative controls, premulsum
# written as a plain a * s + b and with a plain add, show the check failing.
if(SHOAL_HAVE_CUDA AND SHOAL_NVCC)
  set(_ptx_check ${CMAKE_CURRENT_LIST_DIR}/ptx_rounding_check.cmake)
  add_test(NAME cudafake.reduce_kernels.ptx_rounding
    COMMAND ${CMAKE_COMMAND} -DPTX=${SHOAL_REDUCE_KERNELS_PTX} -P ${_ptx_check})
  set_tests_properties(cudafake.reduce_kernels.ptx_rounding PROPERTIES LABELS cudafake TIMEOUT 60)
  set(_control_cu ${CMAKE_CURRENT_LIST_DIR}/ptx_check_control.cu)
  set(_control_dir ${PROJECT_BINARY_DIR}/tests/cudafake)
  add_custom_command(OUTPUT ${_control_dir}/control_fma.ptx ${_control_dir}/control_unrounded.ptx
    COMMAND ${SHOAL_NVCC} -ptx -arch=compute_90 -DSHOAL_CONTROL_FMA ${_control_cu} -o ${_control_dir}/control_fma.ptx
    COMMAND ${SHOAL_NVCC} -ptx -arch=compute_90 ${_control_cu} -o ${_control_dir}/control_unrounded.ptx
    DEPENDS ${_control_cu}
    COMMENT "nvcc -ptx ptx_check_control.cu (the rounding check's negative controls)")
  add_custom_target(shoal_ptx_check_controls ALL
    DEPENDS ${_control_dir}/control_fma.ptx ${_control_dir}/control_unrounded.ptx)
  foreach(_control fma unrounded)
    add_test(NAME cudafake.reduce_kernels.ptx_rounding.control_${_control}
      COMMAND ${CMAKE_COMMAND} -DPTX=${_control_dir}/control_${_control}.ptx -DALL=OFF -P ${_ptx_check})
  endforeach()
  set_tests_properties(cudafake.reduce_kernels.ptx_rounding.control_fma PROPERTIES LABELS cudafake
    TIMEOUT 60 PASS_REGULAR_EXPRESSION "shoal_reduce_premulsum_float has a fused multiply-add")
  set_tests_properties(cudafake.reduce_kernels.ptx_rounding.control_unrounded PROPERTIES LABELS cudafake
    TIMEOUT 60 PASS_REGULAR_EXPRESSION "shoal_reduce_premulsum_float has floating arithmetic without a rounding modifier")
endif()

# libnccl.so.2 names no CUDA library (it loads the driver at run time).
add_test(NAME cudafake.no_cuda_needed
  COMMAND sh -c "! readelf -d \"$1\" | grep NEEDED | grep -iE 'cuda|nvidia'" sh $<TARGET_FILE:nccl>)
set_tests_properties(cudafake.no_cuda_needed PROPERTIES LABELS cudafake TIMEOUT 30)

# The benchmarks on device buffers (--memory device) through the stand-in,
# ranks as threads and as forked processes, data checked.
if(TARGET all_reduce_perf)
  function(shoal_add_device_perf_test name perf)
    add_test(NAME ${name} COMMAND $<TARGET_FILE:${perf}> --memory device ${ARGN})
    set_tests_properties(${name} PROPERTIES LABELS cudafake TIMEOUT 180
      ENVIRONMENT "NCCL_SOCKET_IFNAME=lo;SHOAL_CUDA_DRIVER=${SHOAL_CUDAFAKE_LIB}"
      PASS_REGULAR_EXPRESSION "Out of bounds values : 0 OK"
      FAIL_REGULAR_EXPRESSION "${SHOAL_PERF_FAIL_REGEX}|Memory: host")
  endfunction()
  shoal_add_device_perf_test(cudafake.perf.all_reduce.t3 all_reduce_perf -t 3 -b 8 -e 1M -f 8 -c 1 -n 3)
  shoal_add_device_perf_test(cudafake.perf.all_reduce.procs2.all_ops_types all_reduce_perf --procs 2
    -b 8 -e 16K -f 8 -c 1 -n 2 -o all -d all)
  shoal_add_device_perf_test(cudafake.perf.all_gather.procs2x2 all_gather_perf --procs 2 -t 2 -b 8 -e 256K -f 8 -c 1 -n 3)
  shoal_add_device_perf_test(cudafake.perf.reduce_scatter.procs3 reduce_scatter_perf --procs 3 -b 8 -e 256K -f 8 -c 1 -n 3)
  shoal_add_device_perf_test(cudafake.perf.broadcast.t2 broadcast_perf -t 2 -b 8 -e 256K -f 8 -c 1 -n 3 -r -1)
  shoal_add_device_perf_test(cudafake.perf.sendrecv.procs2 sendrecv_perf --procs 2 -b 8 -e 256K -f 8 -c 1 -n 3)
  # -G: the timed calls captured into a CUDA graph and launched, as
  # nccl-tests does (docs/cuda.md, "Graph capture").
  shoal_add_device_perf_test(cudafake.perf.all_reduce.procs2.graph all_reduce_perf --procs 2
    -b 8 -e 256K -f 8 -c 1 -n 4 -m 2 -G 3)
  shoal_add_device_perf_test(cudafake.perf.all_gather.t2.graph all_gather_perf -t 2 -b 8 -e 256K -f 8 -c 1 -n 3 -G 2)
  # -R 2: the buffers in windows (ncclCommWindowRegister), so AllReduce,
  # AllGather and ReduceScatter read the peers' buffers in place.
  shoal_add_device_perf_test(cudafake.perf.all_reduce.procs3.windows all_reduce_perf --procs 3 -R 2
    -b 8 -e 1M -f 8 -c 1 -n 3 -o all -d float)
  shoal_add_device_perf_test(cudafake.perf.all_gather.procs2.windows all_gather_perf --procs 2 -R 2
    -b 8 -e 1M -f 8 -c 1 -n 3)
  shoal_add_device_perf_test(cudafake.perf.reduce_scatter.t3.windows reduce_scatter_perf -t 3 -R 2
    -b 8 -e 1M -f 8 -c 1 -n 3)
  # The GPU check script's benchmark stage (tools/gpu/check.sh), small, on
  # this build's benchmarks and the stand-in: every run it makes passes its
  # data check and takes the path it names (device-direct, stream plans,
  # device plans between threads, windows read in place), so that its
  # benchmark stages are known to work before a GPU machine is lent.
  add_test(NAME cudafake.gpu_check_script
    COMMAND bash ${PROJECT_SOURCE_DIR}/tools/gpu/check.sh ${PROJECT_BINARY_DIR}/tests/cudafake/gpu-check)
  set_tests_properties(cudafake.gpu_check_script PROPERTIES LABELS cudafake TIMEOUT 300
    ENVIRONMENT "NCCL_SOCKET_IFNAME=lo;SHOAL_CUDA_DRIVER=${SHOAL_CUDAFAKE_LIB};BUILD_DIR=${PROJECT_BINARY_DIR};STAGES=perf;BIG=1M;PERF_MAX=64K;RANKS=1 2;BUDGET_S=280"
    PASS_REGULAR_EXPRESSION "PASS perf"
    FAIL_REGULAR_EXPRESSION "FAIL")
endif()

# tools/gpu/driver_probe.cc asks the driver what the stand-in refuses on
# purpose (a pointer query with no context current, cuFuncLoad as of 12.0,
# the device pointer of memory allocated without DEVICEMAP, queries and
# synchronizations during another thread's global capture, a free during
# the thread's own relaxed one, a stream made while another waits for the
# host); the GPU check's probe stage runs it on the
# real driver. Here it runs on the stand-in, whose answers must be these.
add_executable(cudafake_driver_probe ${PROJECT_SOURCE_DIR}/tools/gpu/driver_probe.cc)
target_link_libraries(cudafake_driver_probe PRIVATE shoal_cuda_headers ${CMAKE_DL_LIBS} Threads::Threads)
add_test(NAME cudafake.driver_probe COMMAND cudafake_driver_probe)
set_tests_properties(cudafake.driver_probe PROPERTIES LABELS cudafake TIMEOUT 60
  ENVIRONMENT "SHOAL_CUDA_DRIVER=${SHOAL_CUDAFAKE_LIB}"
  FAIL_REGULAR_EXPRESSION "set-up:"
  PASS_REGULAR_EXPRESSION "device memory, no context current: CUDA_ERROR_INVALID_CONTEXT.*cuFuncLoad, 12000\\): CUDA_ERROR_NOT_FOUND, status 2, null.*cuFuncLoad, 12040\\): CUDA_SUCCESS.*without DEVICEMAP: CUDA_ERROR_INVALID_VALUE.*cuEventQuery in global mode during another thread's global capture: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.*cuStreamSynchronize in global mode during another thread's global capture: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.*cuEventQuery in relaxed mode during another thread's global capture: CUDA_SUCCESS.*cuStreamSynchronize in relaxed mode during another thread's global capture: CUDA_SUCCESS.*cuStreamEndCapture: CUDA_SUCCESS.*own relaxed capture: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.*while another stream waits for the host: CUDA_SUCCESS, CUDA_SUCCESS")

# Device buffers over the ofi transport: staged (this libfabric grants no
# FI_HMEM), logged with the reason, data checked; a device buffer handed
# straight to an ofi connection refused with the reason.
if(LIBFABRIC_FOUND)
  shoal_cudafake_tests(cudafake_ofi_device_tests 180 ${CMAKE_CURRENT_LIST_DIR}/ofi_device_memory_test.cc
    ${PROJECT_SOURCE_DIR}/tests/support/mp_harness.cc)
  target_include_directories(cudafake_ofi_device_tests SYSTEM PRIVATE
    $<TARGET_PROPERTY:PkgConfig::LIBFABRIC,INTERFACE_INCLUDE_DIRECTORIES>)
endif()

# The stream ring through loopback's connect path (threads of a process).
shoal_cudafake_tests(cudafake_stream_ring_tests 120 ${CMAKE_CURRENT_LIST_DIR}/stream_ring_test.cc)

# The cuda_ipc transport on the stand-in: the conformance suite, device
# buffers, the hello and its secret (forked ranks: cudafake_device_tests).
shoal_cudafake_tests(cudafake_cuda_ipc_tests 300 ${CMAKE_CURRENT_LIST_DIR}/cuda_ipc_test.cc
  ${PROJECT_SOURCE_DIR}/tests/transport/conformance.cc)
