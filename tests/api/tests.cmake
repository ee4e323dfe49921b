# C ABI tests of nccl.h (label "api"); included from tests/CMakeLists.txt.
#   abi_layout_test   Catch2, C++: sizes, offsets, enum values, signatures
#   api.c99_header    strict C99 build of nccl.h, linked to libnccl.so.2 so
#                     that every declared function must be exported

shoal_add_test(abi_layout_test LABEL api
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/abi_layout_test.cc)

add_executable(api_c99_header ${CMAKE_CURRENT_LIST_DIR}/c99_header.c)
target_link_libraries(api_c99_header PRIVATE nccl)
set_target_properties(api_c99_header PROPERTIES
  C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
# Warnings are the point of this test: a header that is not clean C99, or a
# function whose signature differs (incompatible pointer types), fails the build.
target_compile_options(api_c99_header PRIVATE
  -Wall -Wextra -pedantic -Wstrict-prototypes -Werror)
add_test(NAME api.c99_header COMMAND api_c99_header)
set_tests_properties(api.c99_header PROPERTIES LABELS api TIMEOUT 60)

# NCCL behaviours of the public C API in one process (nccl.h, shoal/shoal.h):
# collectives, groups, split, nonblocking, errors, config, memory, params.
shoal_add_test(api_behaviour_tests LABEL api TIMEOUT 300 SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/nccl_behaviour_test.cc)

# Edge arguments of every nccl.h function (NULL handles and out-pointers,
# count 0, double finalize/destroy/deregister): docs/nccl-compat.md, "Edge
# arguments, function by function".
shoal_add_test(api_edge_semantics_tests LABEL api TIMEOUT 120 SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/edge_semantics_test.cc)

# One thread driving several in-process ranks in a group, over transports whose
# connect waits for the peer (the higher rank waits for the lower's hello):
# the split's children connect in an order where, without connect-ahead, a
# waiting side would wait for a rank the same thread reaches only later.
foreach(transport tcp ofi)
  add_test(NAME "api.split_one_thread_over_${transport}"
    COMMAND api_behaviour_tests -w NoTests "ncclCommSplit: halves - duplicate - key order - ties")
  set_tests_properties("api.split_one_thread_over_${transport}" PROPERTIES LABELS api TIMEOUT 120
    ENVIRONMENT "SHOAL_TRANSPORT=${transport};FI_PROVIDER=tcp\\;ofi_rxm;NCCL_SOCKET_IFNAME=lo;FI_TCP_IFACE=lo;SHOAL_INIT_TIMEOUT_MS=30000")
endforeach()

# LD_PRELOAD swap under a binary built against NVIDIA's nccl.h and linked with
# NVIDIA's libnccl.so.2 (registered with ldconfig where the CUDA toolkit is
# installed): with Shoal preloaded, Shoal serves it; without, NVIDIA does.
find_library(SHOAL_NVIDIA_NCCL NAMES libnccl.so.2 nccl
  PATHS /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib NO_DEFAULT_PATH)
find_path(SHOAL_NVIDIA_NCCL_INCLUDE nccl.h PATHS /usr/local/cuda/include NO_DEFAULT_PATH)
if(SHOAL_NVIDIA_NCCL AND SHOAL_NVIDIA_NCCL_INCLUDE)
  add_executable(api_preload_probe ${CMAKE_CURRENT_LIST_DIR}/preload_probe.c)
  target_include_directories(api_preload_probe BEFORE PRIVATE ${SHOAL_NVIDIA_NCCL_INCLUDE})
  target_link_libraries(api_preload_probe PRIVATE ${SHOAL_NVIDIA_NCCL} ${CMAKE_DL_LIBS})
  # As a user's binary: no build rpath to NVIDIA's folder (ldconfig finds it).
  set_target_properties(api_preload_probe PROPERTIES SKIP_BUILD_RPATH ON)
  add_test(NAME api.preload_swaps_nvidia_nccl COMMAND api_preload_probe shoal)
  set_tests_properties(api.preload_swaps_nvidia_nccl PROPERTIES LABELS api TIMEOUT 60
    ENVIRONMENT "LD_PRELOAD=$<TARGET_FILE:nccl>;NCCL_SOCKET_IFNAME=lo")
  add_test(NAME api.preload_probe_without_preload_is_nvidia COMMAND api_preload_probe nvidia)
  set_tests_properties(api.preload_probe_without_preload_is_nvidia PROPERTIES LABELS api TIMEOUT 60)
else()
  add_test(NAME api.preload_swaps_nvidia_nccl COMMAND sh -c
    "echo 'NVIDIA libnccl.so.2 or nccl.h not found under /usr/local/cuda: LD_PRELOAD swap not tested'; exit 77")
  set_tests_properties(api.preload_swaps_nvidia_nccl PROPERTIES LABELS api SKIP_RETURN_CODE 77)
endif()
