# Core vocabulary: Status, parameters (and docs/env.md), tags, engine on fake plans,
# the memory Shoal is told the end of, what the connection table's looks at a
# peer conclude.
shoal_add_test(core_unit_tests LABEL unit SOURCES
  unit/status_test.cc
  unit/params_test.cc
  unit/engine_test.cc
  unit/connection_table_test.cc
  unit/config_test.cc
  unit/init_agreement_test.cc
  unit/known_ranges_test.cc
  unit/turns_test.cc)
target_compile_definitions(core_unit_tests PRIVATE SHOAL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
