# mp: forked-process tests, one rank per process over tcp on 127.0.0.1
# (abort, peer death, no-progress and init deadlines, stray bootstrap clients).
# Included from tests/CMakeLists.txt; the harness watchdog bounds every run.
shoal_add_test(mp_tests LABEL mp TIMEOUT 300 SOURCES
  mp/mp_test.cc
  support/mp_harness.cc)

# SHOAL_CHECK_MODE=1: mismatched calls fail every involved rank.
shoal_add_test(mp_check_mode_tests LABEL mp TIMEOUT 120 SOURCES
  mp/check_mode_test.cc
  support/mp_harness.cc)

# Environment settings and scalar residence through forked ranks.
shoal_add_test(mp_env_tests LABEL mp TIMEOUT 120 SOURCES
  mp/env_test.cc
  support/mp_harness.cc)

# Mismatched calls without the check mode: the message tags fail both ranks.
shoal_add_test(mp_mismatch_tests LABEL mp TIMEOUT 120 SOURCES
  mp/mismatch_test.cc
  support/mp_harness.cc)

# A peer killed while communicators are idle: ncclCommGetAsyncError reports
# it (the idle check, SHOAL_IDLE_CHECK_MS), over tcp and shm, and over ofi
# where libfabric is found.
shoal_add_test(mp_idle_tests LABEL mp TIMEOUT 180 SOURCES
  mp/idle_test.cc
  support/mp_harness.cc)
if(LIBFABRIC_FOUND)
  target_compile_definitions(mp_idle_tests PRIVATE SHOAL_TEST_OFI=1)
endif()

# Hang reports: a stalled rank is named by tools/shoal_hang_report.py.
shoal_add_test(mp_hang_report_tests LABEL mp TIMEOUT 120 SOURCES
  mp/hang_report_test.cc
  support/mp_harness.cc)
target_compile_definitions(mp_hang_report_tests PRIVATE SHOAL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# Elastic communicators: shrink around a SIGKILLed rank (tcp, shm), grow with
# new processes, revoke, argument errors, 50 shrink/grow cycles without leaks.
shoal_add_test(mp_elastic_tests LABEL mp TIMEOUT 300 SOURCES
  mp/elastic_test.cc
  support/mp_harness.cc)

# A process that has used Shoal forks: the child is another process to it
# (its own process id and bootstrap root), and one that exits leaves its
# parent's communicators working (over ofi too where libfabric is found).
shoal_add_test(mp_fork_tests LABEL mp TIMEOUT 120 SOURCES
  mp/fork_test.cc
  support/mp_harness.cc)
if(LIBFABRIC_FOUND)
  target_compile_definitions(mp_fork_tests PRIVATE SHOAL_TEST_OFI=1)
endif()
