# mp: forked-process tests, one rank per process over tcp on 127.0.0.1
# (abort, peer death, no-progress and init deadlines, stray bootstrap clients).
# Included from tests/CMakeLists.txt; the harness watchdog bounds every run.
shoal_add_test(mp_tests LABEL mp TIMEOUT 300 SOURCES
  mp/mp_test.cc
  support/mp_harness.cc)
