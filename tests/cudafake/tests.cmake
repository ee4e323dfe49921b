# The CUDA driver stand-in (libshoal_cudafake.so) and its self test; see
# README.md here. Included from tests/CMakeLists.txt only if(SHOAL_HAVE_CUDA):
# it needs the toolkit's headers (shoal_cuda_headers), never a GPU or driver.
# Paths are relative to this file, wherever it is included from.

add_library(shoal_cudafake SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_cuda.cc)
target_link_libraries(shoal_cudafake PUBLIC shoal_cuda_headers PRIVATE Threads::Threads)
# The reduction kernels run src/reduce/element_ops.h's functions, compiled
# here for the host as in the reducer: a*s+b never contracted into an FMA.
target_include_directories(shoal_cudafake PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_options(shoal_cudafake PRIVATE -fno-fast-math -ffp-contract=off)
if(TARGET shoal_warnings)
  target_link_libraries(shoal_cudafake PRIVATE shoal_warnings)
endif()
# fake_cuda.h, for tests that steer the stand-in.
target_include_directories(shoal_cudafake PUBLIC ${CMAKE_CURRENT_LIST_DIR})
# Export only the cu* entry points and the shoalFakeCuda* controls (the
# project builds with hidden visibility; the sources mark those as default,
# the version script hides the C++ library's template instances). nodelete:
# stream worker threads run this library's code, so it must never be unmapped
# by a dlclose while they may still run.
target_link_options(shoal_cudafake PRIVATE
  "LINKER:--version-script=${CMAKE_CURRENT_LIST_DIR}/exports.map"
  "LINKER:-z,nodelete"
  "LINKER:--no-undefined")
set_target_properties(shoal_cudafake PROPERTIES
  LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/exports.map)
# Test infrastructure: never installed (no install() rule on purpose).

add_executable(cudafake_selftest ${CMAKE_CURRENT_LIST_DIR}/fake_selftest.cc)
target_link_libraries(cudafake_selftest PRIVATE shoal_cudafake shoal_catch_main Catch2::Catch2 Threads::Threads)
if(TARGET shoal_warnings)
  target_link_libraries(cudafake_selftest PRIVATE shoal_warnings)
endif()
catch_discover_tests(cudafake_selftest EXTRA_ARGS -w NoTests PROPERTIES LABELS cudafake TIMEOUT 120)
