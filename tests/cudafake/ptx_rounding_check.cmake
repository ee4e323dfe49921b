# Checks the PTX nvcc produced for the device reduction kernels
# (src/cuda/reduce_kernels.cu):
#   - every kernel of the 12 types x 6 operators is declared (ALL=ON);
#   - no kernel holds an fma instruction, nor a floating add, sub or mul
#     without a rounding modifier (.rn, .rz, ...): PTX lets ptxas fuse those
#     into an FMA, so premulsum and avg would round once instead of twice and
#     stop matching the host reducer.
# Fails (FATAL_ERROR) naming the kernel and the instruction.
#   cmake -DPTX=reduce_kernels.ptx [-DALL=OFF] -P ptx_rounding_check.cmake
# The reason on one unwrapped line (FATAL_ERROR text is wrapped), then failure.
function(fail reason)
  message(NOTICE "ptx_rounding_check: ${reason}")
  message(FATAL_ERROR "ptx_rounding_check failed")
endfunction()

if(NOT PTX)
  message(FATAL_ERROR "usage: cmake -DPTX=file.ptx [-DALL=OFF] -P ptx_rounding_check.cmake")
endif()
if(NOT DEFINED ALL)
  set(ALL ON)
endif()
file(READ "${PTX}" text)
set(types int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2)
set(ops sum prod max min premulsum avg)

# The kernels the file declares, in order, with where each body starts.
string(REGEX MATCHALL "\\.entry shoal_reduce_[a-z0-9]+_[a-z0-9]+\\(" entries "${text}")
list(LENGTH entries declared)
if(declared EQUAL 0)
  fail("${PTX}: no shoal_reduce_ kernel")
endif()
if(ALL)
  foreach(op IN LISTS ops)
    foreach(type IN LISTS types)
      list(FIND entries ".entry shoal_reduce_${op}_${type}(" at)
      if(at EQUAL -1)
        fail("${PTX}: the kernel shoal_reduce_${op}_${type} is missing")
      endif()
    endforeach()
  endforeach()
endif()

set(checked 0)
set(unrounded "[^a-z.](add|sub|mul)(\\.ftz)?(\\.sat)?\\.(f16|f16x2|bf16|bf16x2|f32|f64)[ \t]")
foreach(entry IN LISTS entries)
  string(REGEX REPLACE "^\\.entry (.*)\\($" "\\1" name "${entry}")
  string(FIND "${text}" "${entry}" start)
  string(SUBSTRING "${text}" ${start} -1 rest)
  string(LENGTH "${entry}" skip)
  string(SUBSTRING "${rest}" ${skip} -1 after)
  string(FIND "${after}" ".entry " next)
  if(next GREATER -1)
    string(SUBSTRING "${after}" 0 ${next} body)
  else()
    set(body "${after}")
  endif()
  string(REGEX MATCH "[^\n]*fma\\.[^\n]*" fused "${body}")
  if(fused)
    string(STRIP "${fused}" fused)
    fail("${PTX}: ${name} has a fused multiply-add: ${fused}")
  endif()
  string(REGEX MATCH "[^\n]*${unrounded}[^\n]*" loose "${body}")
  if(loose)
    string(STRIP "${loose}" loose)
    fail("${PTX}: ${name} has floating arithmetic without a rounding modifier (ptxas may fuse it into an FMA): ${loose}")
  endif()
  math(EXPR checked "${checked} + 1")
endforeach()
message(STATUS "${PTX}: ${checked} kernels, none with fma or unrounded floating add/sub/mul")
