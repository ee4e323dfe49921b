# Tuner decision tables, cost model, SHOAL_TUNER_FILE and NCCL_ALGO parsing,
# topology subgroups and machine discovery.
shoal_add_test(tuner_tests LABEL unit SOURCES unit/tuner_test.cc)
