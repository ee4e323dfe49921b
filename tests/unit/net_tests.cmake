# Unit tests of src/net and src/bootstrap (owned with those folders). Loopback
# only (NCCL_SOCKET_IFNAME=lo is set by shoal_add_test).
shoal_add_test(net_unit_tests LABEL unit
  SOURCES unit/net_test.cc unit/bootstrap_test.cc
  TIMEOUT 300)
