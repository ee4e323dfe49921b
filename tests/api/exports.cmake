# The ABI of the product: exported symbols, soname, no symbol versions.
add_test(NAME api.exports
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/exports_test.sh $<TARGET_FILE:nccl>
          ${PROJECT_SOURCE_DIR}/include/nccl.h)
set_tests_properties(api.exports PROPERTIES LABELS api TIMEOUT 60)
