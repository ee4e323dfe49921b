# Warnings and sanitizers applied to every Shoal target through shoal_warnings.
add_library(shoal_warnings INTERFACE)
target_compile_options(shoal_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers>
  $<$<BOOL:${SHOAL_WERROR}>:-Werror>)
if(SHOAL_SANITIZE)
  string(REPLACE "," ";" _san "${SHOAL_SANITIZE}")
  foreach(s IN LISTS _san)
    add_compile_options(-fsanitize=${s} -fno-omit-frame-pointer)
    add_link_options(-fsanitize=${s})
  endforeach()
  if("undefined" IN_LIST _san)
    # C callers may pass any int as an NCCL enum; src/api range-checks them.
    # A report stops the process, so a test cannot pass over one.
    add_compile_options(-fno-sanitize=enum -fno-sanitize-recover=undefined)
  endif()
endif()
