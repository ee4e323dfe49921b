// The AVX2 path (with F16C and BMI2): reduce_simd.inc compiled for 32-byte
// registers. Chosen at run time on CPUs without AVX-512 (reduce.cc,
// cpuSupportsIsa).
#include "reduce/reduce_internal.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "reduce/numerics.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c,bmi,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c,bmi,bmi2")
#endif

#define SHOAL_SIMD_W 32
#define SHOAL_SIMD_AVX512 0
#define SHOAL_SIMD_NAME "avx2"
#define SHOAL_SIMD_EXPORT avx2Kernels
#include "reduce/reduce_simd.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#include "reduce/reduce_simd_table.inc"

#else

namespace shoal::reduce {
const Kernels* avx2Kernels() { return nullptr; }
}  // namespace shoal::reduce

#endif
