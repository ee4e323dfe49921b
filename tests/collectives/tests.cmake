# Collectives: rank arithmetic, plan utilities, the verifier and the reference
# simulator over every builder (collectives/). Pure CPU, no transport.
shoal_add_test(plan_tests LABEL unit TIMEOUT 300 SOURCES
  collectives/patterns_test.cc
  collectives/plan_test.cc
  collectives/plan_verify_test.cc
  collectives/plan_simulate_test.cc)
target_link_libraries(plan_tests PRIVATE shoal_plan_check)
