# Third-party dependencies, all from Debian 12 packages.
find_package(Threads REQUIRED)
# hwloc and libfabric are optional (found through pkg-config, itself optional:
# a machine without it builds without them).
find_package(PkgConfig)
if(PkgConfig_FOUND)
  pkg_check_modules(HWLOC IMPORTED_TARGET hwloc)
  pkg_check_modules(LIBFABRIC IMPORTED_TARGET libfabric)
endif()
if(SHOAL_WITH_MPI)
  find_package(MPI COMPONENTS CXX)
endif()
if(SHOAL_BUILD_TESTS)
  find_package(Catch2 2 REQUIRED)
endif()
if(SHOAL_BUILD_BENCH)
  find_package(benchmark)
endif()
# CUDA is optional. The library needs only the toolkit's headers (cuda.h,
# cudaTypedefs.h): it calls the driver API through libcuda.so.1, loaded at run
# time, and links no CUDA library (src/cuda/README.md).
set(SHOAL_HAVE_CUDA OFF)
if(NOT SHOAL_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(SHOAL_HAVE_CUDA ON)
    add_library(shoal_cuda_headers INTERFACE)
    target_include_directories(shoal_cuda_headers SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
    target_compile_definitions(shoal_cuda_headers INTERFACE SHOAL_HAVE_CUDA=1)
    # nvcc compiles the wait kernel to PTX (optional: without it there is none).
    find_program(SHOAL_NVCC nvcc HINTS ${CUDAToolkit_BIN_DIR})
    message(STATUS "shoal: CUDA toolkit ${CUDAToolkit_VERSION} found: device-memory path built"
      " (wait kernel: ${SHOAL_NVCC})")
  elseif(SHOAL_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "shoal: SHOAL_WITH_CUDA=ON but the CUDA toolkit was not found")
  else()
    message(STATUS "shoal: no CUDA toolkit: host memory only")
  endif()
else()
  message(STATUS "shoal: SHOAL_WITH_CUDA=OFF: host memory only")
endif()
