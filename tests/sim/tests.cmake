# sim: N ranks in one process over the loopback transport, pumped by one thread.
shoal_add_test(sim_tests LABEL sim TIMEOUT 600 SOURCES
  sim/sim_collectives_test.cc)
