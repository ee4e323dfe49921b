# soak: the library's threads, fds, /dev/shm entries and memory stay flat over
# many operations (README.md). Included from tests/CMakeLists.txt.
#   soak_threads_tests  ranks as threads of one process
#   soak_forked_tests   ranks as forked processes over shm and tcp
#   soak_bench          the same driver for hours: --seconds N --report-every S
add_library(shoal_soak_driver STATIC
  ${CMAKE_CURRENT_LIST_DIR}/soak.cc
  ${PROJECT_SOURCE_DIR}/tests/support/mp_harness.cc)
target_link_libraries(shoal_soak_driver PUBLIC shoal_static)
target_include_directories(shoal_soak_driver PUBLIC ${PROJECT_SOURCE_DIR}/tests)

shoal_add_test(soak_threads_tests LABEL soak TIMEOUT 120 SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/soak_threads_test.cc)
target_link_libraries(soak_threads_tests PRIVATE shoal_soak_driver)

shoal_add_test(soak_forked_tests LABEL soak TIMEOUT 150 SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/soak_forked_test.cc)
target_link_libraries(soak_forked_tests PRIVATE shoal_soak_driver)

add_executable(soak_bench ${CMAKE_CURRENT_LIST_DIR}/soak_bench.cc)
target_link_libraries(soak_bench PRIVATE shoal_soak_driver)

# The benchmark's own loop, briefly, in every setting: the steady-state modes (the
# churn modes' own cases cover them, README.md), a report every 3 s, exit 0 only if
# nothing grew beyond the slack.
add_test(NAME soak.bench_smoke COMMAND soak_bench --seconds 10 --report-every 3 --setting all
  --modes blocking,nonblocking,hoststream,grouped)
set_tests_properties(soak.bench_smoke PROPERTIES LABELS soak TIMEOUT 120 ENVIRONMENT "NCCL_SOCKET_IFNAME=lo")

# The checks catch what they claim to: the test leaks one resource on purpose
# (SOAK_INJECT, soak.cc) or corrupts one AllReduce result, and must report it.
foreach(inject fd thread shm rss heap data)
  set(expect_fd "LEAK while running: fds")
  set(expect_thread "LEAK while running: threads")
  set(expect_shm "LEAK while running: /dev/shm entries")
  set(expect_rss "LEAK while running: RSS")
  set(expect_heap "HEAP GROWS heap growth per third")
  set(expect_data "AllReduce\\(sum\\) of [0-9]+ elements .*element 0 is")
  add_test(NAME soak.selfcheck.${inject}
    COMMAND soak_threads_tests -w NoTests "soak threads blocking collectives")
  set_tests_properties(soak.selfcheck.${inject} PROPERTIES LABELS soak TIMEOUT 60
    ENVIRONMENT "SOAK_INJECT=${inject};NCCL_SOCKET_IFNAME=lo"
    PASS_REGULAR_EXPRESSION "${expect_${inject}}")
endforeach()
