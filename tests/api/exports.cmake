# NVIDIA's libnccl.so.2, where the CUDA toolkit carries one: every function it
# exports, Shoal's must too.
find_file(SHOAL_NVIDIA_NCCL_FOR_EXPORTS libnccl.so.2 PATHS /usr/local/cuda/lib64 /usr/local/cuda/lib
          NO_DEFAULT_PATH)
if(NOT SHOAL_NVIDIA_NCCL_FOR_EXPORTS)
  set(SHOAL_NVIDIA_NCCL_FOR_EXPORTS "")
endif()
# The ABI of the product: exported symbols, soname, no symbol versions.
add_test(NAME api.exports
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/exports_test.sh $<TARGET_FILE:nccl>
          ${PROJECT_SOURCE_DIR}/include/nccl.h ${SHOAL_NVIDIA_NCCL_FOR_EXPORTS})
set_tests_properties(api.exports PROPERTIES LABELS api TIMEOUT 60)
