# Unit tests of pure functions: one executable; each component adds its file.
shoal_add_test(unit_tests LABEL unit SOURCES
  unit/reduce_test.cc)

# The reducer's reference arithmetic must not fuse a*s+b into an FMA either.
set_source_files_properties(unit/reduce_test.cc PROPERTIES
  COMPILE_OPTIONS "-fno-fast-math;-ffp-contract=off")
