// Code that compiles for the host (g++, clang) and for the GPU (nvcc): the
// reducer's element arithmetic is written once and runs in both places
// (element_ops.h; the device kernels in src/cuda/reduce_kernels.cu).
//
// Only what differs between the two compilers lives here: the function
// qualifiers, reinterpreting bits, counting leading zeros, and float
// arithmetic with exactly one rounding per operation. The rounding helpers
// are the reason a*s + b is never fused into one FMA on either side: nvcc
// contracts a plain `a * s + b` (and lets ptxas fuse mul/add that carry no
// rounding modifier), so device code uses the _rn intrinsics, which PTX
// keeps as separate mul.rn / add.rn; host code is compiled with
// -ffp-contract=off (shoal_no_fp_contract in CMake), and without FMA
// instructions in the x86-64 baseline a contraction could not happen anyway.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SHOAL_HOST_DEVICE __host__ __device__
#else
#define SHOAL_HOST_DEVICE
#endif

namespace shoal::reduce {

SHOAL_HOST_DEVICE inline uint32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
SHOAL_HOST_DEVICE inline float bitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
SHOAL_HOST_DEVICE inline uint64_t doubleBits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
#endif
}
SHOAL_HOST_DEVICE inline double bitsDouble(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, 8);
  return d;
#endif
}

// Leading zero bits of a nonzero 32-bit value.
SHOAL_HOST_DEVICE inline int leadingZeros32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(x));
#else
  return __builtin_clz(x);
#endif
}

// One IEEE operation, rounded once to nearest even: never fused with a
// neighbouring multiply or add (see the file comment).
SHOAL_HOST_DEVICE inline float addRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SHOAL_HOST_DEVICE inline float mulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SHOAL_HOST_DEVICE inline double addRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
SHOAL_HOST_DEVICE inline double mulRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

}  // namespace shoal::reduce
