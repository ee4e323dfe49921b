# ofi transport tests: the conformance suite per libfabric provider
# ("tcp;ofi_rxm" on lo, shm) and ofi-specific cases (transport/ofi_test.cc).
# Built only where libfabric's headers are (the transport is a stub without).
if(LIBFABRIC_FOUND)
  shoal_add_test(ofi_transport_tests LABEL unit TIMEOUT 300 SOURCES
    transport/conformance.cc
    transport/ofi_test.cc)
  target_include_directories(ofi_transport_tests SYSTEM PRIVATE
    $<TARGET_PROPERTY:PkgConfig::LIBFABRIC,INTERFACE_INCLUDE_DIRECTORIES>)
endif()
