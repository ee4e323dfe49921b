# sim: N ranks in one process over the loopback transport, pumped by one thread.
shoal_add_test(sim_tests LABEL sim TIMEOUT 600 SOURCES
  sim/sim_collectives_test.cc)
# ncclAvg's exact bits through the public API (3 ranks from ncclCommInitAll).
target_sources(sim_tests PRIVATE sim/avg_numerics_test.cc)
# The expected values are IEEE arithmetic written out: no FMA contraction.
set_source_files_properties(sim/avg_numerics_test.cc PROPERTIES
  COMPILE_OPTIONS "-fno-fast-math;-ffp-contract=off")
