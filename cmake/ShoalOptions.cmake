# Build options; every one is prefixed SHOAL_.
option(SHOAL_BUILD_TESTS "Build the test suite" ON)
option(SHOAL_BUILD_BENCH "Build the benchmarks (bench/perf, bench/micro)" ON)
option(SHOAL_WITH_MPI "Build MPI launch support into bench/perf" ON)
option(SHOAL_WERROR "Treat warnings as errors" OFF)
set(SHOAL_SANITIZE "" CACHE STRING "Sanitizers to build with: address, undefined, thread (comma list)")
set(SHOAL_WITH_CUDA AUTO CACHE STRING
  "Build the CUDA device-memory path: AUTO (when the toolkit's headers are found), ON (required), OFF")
set_property(CACHE SHOAL_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
option(SHOAL_REQUIRE_DEPS
  "Fail at configure time when an optional dependency is missing (MPI, libfabric, hwloc, the CUDA toolkit): the test command sets it, so a CI run cannot shrink without a word" OFF)
