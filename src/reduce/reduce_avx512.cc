// The AVX-512 path (F, BW, VL, DQ, with F16C and BMI2): reduce_simd.inc
// compiled for 64-byte registers with masked tails. Chosen at run time only on
// CPUs that have all of these (reduce.cc, cpuSupportsIsa).
#include "reduce/reduce_internal.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "reduce/numerics.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c,bmi,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c,bmi,bmi2")
#endif

#define SHOAL_SIMD_W 64
#define SHOAL_SIMD_AVX512 1
#define SHOAL_SIMD_NAME "avx512"
#define SHOAL_SIMD_EXPORT avx512Kernels
#include "reduce/reduce_simd.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#include "reduce/reduce_simd_table.inc"

#else

namespace shoal::reduce {
const Kernels* avx512Kernels() { return nullptr; }
}  // namespace shoal::reduce

#endif
