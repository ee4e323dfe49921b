# mp over ofi: forked processes with SHOAL_TRANSPORT=ofi and FI_PROVIDER set
# per run ("tcp;ofi_rxm" on lo, shm), or ncclConfig_t.netName alone; needs
# "ofi" in transports/registry.cc.
if(LIBFABRIC_FOUND)
  shoal_add_test(ofi_mp_tests LABEL mp TIMEOUT 300 SOURCES
    mp/ofi_mp_test.cc
    support/mp_harness.cc)
endif()
