// Scalar number formats of the reducer: half, bfloat16 and the two fp8 formats,
// converted to and from float with bit manipulation only.
//
// Role: the single definition of every rounding rule the reducer uses. The
// scalar kernels call these directly; the vector kernels implement the same
// rules on vectors (reduce_simd.inc) and the unit tests prove them equal.
// Pure inline functions; thread-safe. Host and device code (host_device.h):
// the GPU's reduction kernels convert with these same functions.
//
// Rules (see reduce.h for why):
//   - float -> small format: round to nearest, ties to even, on the exact float
//     value (independent of MXCSR: no float arithmetic, denormal inputs honoured).
//   - Subnormals of every format are produced and consumed exactly.
//   - Any NaN becomes the format's canonical NaN, positive: half 0x7FFF,
//     bf16 0x7FFF, e4m3 0x7F, e5m2 0x7F (what the GPU produces).
//   - Overflow (and float infinities): half/bf16 -> +-inf; e5m2 -> +-inf, e4m3
//     -> the canonical NaN (kFp8Saturate false, CUDA __NV_NOSAT) or +-max finite
//     for both fp8 formats (kFp8Saturate true, CUDA __NV_SATFINITE).
//   - small format -> float is exact (NaN payloads are not preserved).
#pragma once

#include <cstdint>

#include "reduce/host_device.h"

namespace shoal::reduce {

// Whether float -> fp8 saturates out-of-range values (and infinities) to the
// largest finite value, as CUDA's __NV_SATFINITE does. NCCL's device code
// converts its half-precision fp8 results with the __nv_fp8_e4m3/e5m2
// constructors, which use SATFINITE, and so does Shoal (reduce.h). One switch
// for every path; the tests take their expectations from the formats'
// definitions and NCCL's choice, not from this constant.
inline constexpr bool kFp8Saturate = true;

inline constexpr uint32_t kFloatCanonicalNaN = 0x7FFFFFFFu;
inline constexpr uint64_t kDoubleCanonicalNaN = 0x7FFFFFFFFFFFFFFFull;

// Parameters of a small binary format with E exponent bits and M mantissa bits.
//   bias        exponent bias
//   lastFinite  the largest float (as bits, sign cleared) that rounds to a finite
//               value of the format
//   overflow    the code (sign cleared) of a value beyond lastFinite
//   nan         the canonical NaN code
//   nanAbove    |code| > nanAbove means NaN
struct SmallFormat {
  int m;
  int bias;
  int totalBits;
  uint32_t lastFinite;
  uint32_t overflow;
  uint32_t nan;
  uint32_t nanAbove;
};

// The formats are made by functions (device code may not read a host
// object); the k*Format constants are for host code's constant expressions.
// half: max 65504; 65520 (the midpoint to 2^16) ties to even = overflow.
SHOAL_HOST_DEVICE constexpr SmallFormat halfFormat() {
  return {10, 15, 16, 0x477FEFFFu, 0x7C00u, 0x7FFFu, 0x7C00u};
}
// e5m2: max 57344 (0x7B); 61440 ties to even = overflow.
SHOAL_HOST_DEVICE constexpr SmallFormat e5m2Format() {
  return {2, 15, 8, 0x476FFFFFu, kFp8Saturate ? 0x7Bu : 0x7Cu, 0x7Fu, 0x7Cu};
}
// e4m3 (OCP E4M3FN): max 448 (0x7E); 464 ties to even = 448; above is overflow.
SHOAL_HOST_DEVICE constexpr SmallFormat e4m3Format() {
  return {3, 7, 8, 0x43E80000u, kFp8Saturate ? 0x7Eu : 0x7Fu, 0x7Fu, 0x7Eu};
}
inline constexpr SmallFormat kHalfFormat = halfFormat();
inline constexpr SmallFormat kE5m2Format = e5m2Format();
inline constexpr SmallFormat kE4m3Format = e4m3Format();

// Rounds a float (given as bits) to the small format, RNE. Integer-only.
SHOAL_HOST_DEVICE inline uint32_t floatToSmall(uint32_t x, SmallFormat f) {
  const uint32_t sign = (x >> 31) << (f.totalBits - 1);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return f.nan;
  uint32_t r;
  if (ax > f.lastFinite) {
    if (f.overflow > f.nanAbove) return f.nan;  // e4m3 without saturation: NaN, unsigned
    r = f.overflow;
  } else if (ax < uint32_t(128 - f.bias) << 23) {
    // Subnormal (or zero) in the target: count units of 2^(1-bias-m).
    const uint32_t e = ax >> 23;
    const uint32_t mant = (ax & 0x7FFFFFu) | (e != 0 ? 0x800000u : 0u);
    uint32_t sh = uint32_t(151 - f.bias - f.m) - (e != 0 ? e : 1u);
    if (sh > 31) sh = 31;
    r = (mant + ((1u << (sh - 1)) - 1u) + ((mant >> sh) & 1u)) >> sh;
  } else {
    const int shift = 23 - f.m;
    r = (ax + (uint32_t(f.bias - 127) << 23) + ((1u << (shift - 1)) - 1u) + ((ax >> shift) & 1u)) >>
        shift;
  }
  return r | sign;
}

// Exact conversion of a small-format code to float.
SHOAL_HOST_DEVICE inline float smallToFloat(uint32_t c, SmallFormat f) {
  const int ebits = f.totalBits - 1 - f.m;
  const uint32_t sign = (c >> (f.totalBits - 1)) & 1u;
  const uint32_t mag = c & ((1u << (f.totalBits - 1)) - 1u);
  const uint32_t e = mag >> f.m;
  const uint32_t mant = mag & ((1u << f.m) - 1u);
  uint32_t bits;
  if (mag > f.nanAbove) {
    bits = kFloatCanonicalNaN;
    return bitsFloat(bits);
  } else if (mag == f.nanAbove && f.nanAbove == (((1u << ebits) - 1u) << f.m)) {
    bits = 0x7F800000u;  // IEEE-like formats: all-ones exponent, zero mantissa
  } else if (e == 0) {
    // Subnormal: mant * 2^(1-bias-m); exact in float and a normal float.
    // Built from bits to stay independent of MXCSR (DAZ/FTZ).
    if (mant == 0) {
      bits = 0;
    } else {
      const int lz = f.m - (31 - leadingZeros32(mant));  // shifts to normalize
      const uint32_t mm = mant << lz;
      const int exp = 1 - f.bias - lz;  // value = 1.xxx * 2^exp
      bits = (uint32_t(exp + 127) << 23) | ((mm & ((1u << f.m) - 1u)) << (23 - f.m));
    }
  } else {
    bits = (uint32_t(int(e) - f.bias + 127) << 23) | (mant << (23 - f.m));
  }
  return bitsFloat(bits | (sign << 31));
}

SHOAL_HOST_DEVICE inline float halfToFloat(uint16_t h) { return smallToFloat(h, halfFormat()); }
SHOAL_HOST_DEVICE inline uint16_t floatToHalf(float f) {
  return uint16_t(floatToSmall(floatBits(f), halfFormat()));
}
SHOAL_HOST_DEVICE inline float e4m3ToFloat(uint8_t c) { return smallToFloat(c, e4m3Format()); }
SHOAL_HOST_DEVICE inline uint8_t floatToE4m3(float f) {
  return uint8_t(floatToSmall(floatBits(f), e4m3Format()));
}
SHOAL_HOST_DEVICE inline float e5m2ToFloat(uint8_t c) { return smallToFloat(c, e5m2Format()); }
SHOAL_HOST_DEVICE inline uint8_t floatToE5m2(float f) {
  return uint8_t(floatToSmall(floatBits(f), e5m2Format()));
}

// bfloat16 is the top half of a float: widening is a shift.
SHOAL_HOST_DEVICE inline float bf16ToFloat(uint16_t b) {
  uint32_t x = uint32_t(b) << 16;
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) x = kFloatCanonicalNaN;
  return bitsFloat(x);
}
SHOAL_HOST_DEVICE inline uint16_t floatToBf16(float f) {
  const uint32_t x = floatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  return uint16_t((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace shoal::reduce
