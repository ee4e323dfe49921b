# Transport tests: the conformance suite (written once, instantiated per
# transport) and transport-specific cases. tcp traffic stays on loopback.
set(_shoal_transport_test_sources
  transport/conformance.cc
  transport/tcp_test.cc
  transport/shm_test.cc)
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/loopback_test.cc)
  list(APPEND _shoal_transport_test_sources transport/loopback_test.cc)
endif()
shoal_add_test(transport_tests LABEL unit SOURCES ${_shoal_transport_test_sources} TIMEOUT 300)
