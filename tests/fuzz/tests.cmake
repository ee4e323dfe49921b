# Fuzz targets as CTest tests, label "fuzz" (tests/fuzz/README.md).
# Included from tests/CMakeLists.txt (the GCC build): the targets themselves
# are built by clang in their own project (build/fuzz) by the fixture test
# fuzz.build; each fuzz.<target> then replays its corpus and fuzzes afresh
# for SHOAL_FUZZ_SECONDS seconds (tests/fuzz/run.sh).
# 8 s each in CI: on 2 cores the build (~2 min) and 14 targets at 20 s took
# 7.1 min, which the 45-minute CI budget cannot spare; 8 s keeps the label
# near 4 min (longer runs: tests/fuzz/README.md).
set(SHOAL_FUZZ_SECONDS 8 CACHE STRING "Seconds of fresh fuzzing in each fuzz.<target> test")
set(SHOAL_FUZZ_TARGETS
  store_server store_client unique_id comm_id socket_ifname conf_file loopback_faults
  peer_info tcp_hello tcp_segments shm_address shm_ring cuda_ipc_hello ofi_hello ofi_address)

# clang++ and its libFuzzer runtime (Debian: clang, libclang-rt-14-dev).
find_program(SHOAL_FUZZ_CLANGXX clang++)
set(_shoal_fuzz_missing "")
if(NOT SHOAL_FUZZ_CLANGXX)
  set(_shoal_fuzz_missing "clang++ is not installed")
else()
  execute_process(COMMAND ${SHOAL_FUZZ_CLANGXX} -print-file-name=libclang_rt.fuzzer-${CMAKE_SYSTEM_PROCESSOR}.a
                  OUTPUT_VARIABLE _shoal_fuzz_rt OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${_shoal_fuzz_rt}" OR NOT EXISTS "${_shoal_fuzz_rt}")
    set(_shoal_fuzz_missing "clang's libFuzzer runtime (libclang_rt.fuzzer) is not installed")
  endif()
endif()

if(_shoal_fuzz_missing)
  message(STATUS "shoal: ${_shoal_fuzz_missing}: the fuzz label is one failing test, fuzz.clang_missing")
  add_test(NAME fuzz.clang_missing
           COMMAND sh -c "echo 'fuzz tests: ${_shoal_fuzz_missing}; install clang and libclang-rt-14-dev (scripts/install_deps.sh)' >&2; exit 1")
  set_tests_properties(fuzz.clang_missing PROPERTIES LABELS fuzz)
  return()
endif()

add_test(NAME fuzz.build COMMAND bash tests/fuzz/run.sh --build WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(fuzz.build PROPERTIES LABELS fuzz FIXTURES_SETUP shoal_fuzz_build TIMEOUT 1800)

math(EXPR _shoal_fuzz_timeout "${SHOAL_FUZZ_SECONDS} * 3 + 300")
foreach(target IN LISTS SHOAL_FUZZ_TARGETS)
  add_test(NAME fuzz.${target}
           COMMAND bash tests/fuzz/run.sh ${target} ${SHOAL_FUZZ_SECONDS}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(fuzz.${target} PROPERTIES
    LABELS fuzz FIXTURES_REQUIRED shoal_fuzz_build TIMEOUT ${_shoal_fuzz_timeout})
endforeach()
