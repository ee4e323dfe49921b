// The data types' number formats written from their definitions, for test
// oracles that must not lean on the library's own conversions
// (src/reduce/numerics.h) or reducers: decoding, rounding and exact encoding.
//
// Sources: IEEE 754 binary16; bfloat16 (the top half of binary32); OCP FP8
// E4M3 (bias 7, no infinities, S.1111.111 NaN, max 448 = 0x7E) and E5M2
// (bias 15, IEEE-like, inf 0x7C, max 57344 = 0x7B). Rounding is to nearest,
// ties to even. fp8 overflow is NCCL's: its kernels convert with CUDA's
// __nv_fp8_e4m3/e5m2 constructors, __nv_cvt_float_to_fp8(x, __NV_SATFINITE,
// ...), so values beyond the largest finite one and infinities become +-max
// finite (e5m2 included). NaN rounds to the canonical positive NaN (0x7FFF,
// 0x7F), what the GPU's conversions produce.
//
// Slow (a binary search over codes) and obviously correct; header only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/types.h"

namespace shoal::testing {

struct Format {
  DataType type;
  int bits;          // 8 or 16
  uint32_t maxCode;  // largest finite positive code
  uint32_t overflowCode;
  uint32_t nanCode;
};

inline Format formatOf(DataType t) {
  switch (t) {
    case DataType::kFloat16: return {t, 16, 0x7BFF, 0x7C00, 0x7FFF};
    case DataType::kBfloat16: return {t, 16, 0x7F7F, 0x7F80, 0x7FFF};
    case DataType::kFloat8e4m3: return {t, 8, 0x7E, 0x7E, 0x7F};  // SATFINITE: max finite
    case DataType::kFloat8e5m2: return {t, 8, 0x7B, 0x7B, 0x7F};  // SATFINITE: not inf 0x7C
    default: throw std::logic_error("not a small format");
  }
}

inline bool isSmallFormat(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBfloat16 || t == DataType::kFloat8e4m3 ||
         t == DataType::kFloat8e5m2;
}

// Value of a code from the format definition (NaN for NaN codes).
inline double refValue(DataType t, uint32_t c) {
  int ebits, mbits, bias;
  switch (t) {
    case DataType::kFloat16: ebits = 5, mbits = 10, bias = 15; break;
    case DataType::kBfloat16: ebits = 8, mbits = 7, bias = 127; break;
    case DataType::kFloat8e4m3: ebits = 4, mbits = 3, bias = 7; break;
    case DataType::kFloat8e5m2: ebits = 5, mbits = 2, bias = 15; break;
    default: throw std::logic_error("not a small format");
  }
  const int total = 1 + ebits + mbits;
  const bool neg = (c >> (total - 1)) & 1;
  const uint32_t e = (c >> mbits) & ((1u << ebits) - 1);
  const uint32_t m = c & ((1u << mbits) - 1);
  double v;
  if (t == DataType::kFloat8e4m3) {
    if (e == 15 && m == 7) return std::nan("");
  } else if (e == (1u << ebits) - 1) {
    if (m != 0) return std::nan("");
    return neg ? -INFINITY : INFINITY;
  }
  if (e == 0) {
    v = std::ldexp(double(m), 1 - bias - mbits);
  } else {
    v = std::ldexp(double(m + (1u << mbits)), int(e) - bias - mbits);
  }
  return neg ? -v : v;
}

inline bool isNanCode(const Format& f, uint32_t c) { return std::isnan(refValue(f.type, c)); }

// Rounding by definition: the nearest code, ties to the even code, by search.
inline uint32_t refRound(const Format& f, double x) {
  if (std::isnan(x)) return f.nanCode;
  const uint32_t sign = std::signbit(x) ? (1u << (f.bits - 1)) : 0u;
  const double ax = std::fabs(x);
  // Largest code whose value <= ax (codes are monotone in value).
  uint32_t lo = 0, hi = f.maxCode;
  if (ax >= refValue(f.type, f.maxCode)) {
    lo = f.maxCode;
  } else {
    while (hi - lo > 1) {
      const uint32_t mid = (lo + hi) / 2;
      (refValue(f.type, mid) <= ax ? lo : hi) = mid;
    }
  }
  const double vlo = refValue(f.type, lo);
  if (vlo == ax) return lo | sign;
  const uint32_t up = lo + 1;
  const double vup = lo == f.maxCode ? vlo + (vlo - refValue(f.type, lo - 1)) : refValue(f.type, up);
  uint32_t pick;
  if (ax - vlo < vup - ax) {
    pick = lo;
  } else if (ax - vlo > vup - ax) {
    pick = up;
  } else {
    pick = (lo & 1) ? up : lo;
  }
  if (pick > f.maxCode) return isNanCode(f, f.overflowCode) ? f.nanCode : f.overflowCode | sign;
  return pick | sign;
}

// x rounded to a floating type, as a double: float and double by the CPU's
// IEEE arithmetic, the small formats by refRound.
inline double roundTo(DataType t, double x) {
  if (t == DataType::kFloat64) return x;
  if (t == DataType::kFloat32) return static_cast<float>(x);
  return refValue(t, refRound(formatOf(t), x));
}

// Stores v as one element of t; v must be exactly representable (an integer
// in range for integer types). Throws otherwise: an oracle never rounds
// silently.
inline void encodeExact(DataType t, double v, void* out) {
  auto put = [&](auto x) {
    if (!(static_cast<double>(x) == v))
      throw std::logic_error("encodeExact: " + std::to_string(v) + " is not exact in " + dataTypeName(t));
    std::memcpy(out, &x, sizeof x);
  };
  switch (t) {
    case DataType::kInt8: return put(static_cast<int8_t>(v));
    case DataType::kUint8: return put(static_cast<uint8_t>(v));
    case DataType::kInt32: return put(static_cast<int32_t>(v));
    case DataType::kUint32: return put(static_cast<uint32_t>(v));
    case DataType::kInt64: return put(static_cast<int64_t>(v));
    case DataType::kUint64: return put(static_cast<uint64_t>(v));
    case DataType::kFloat32: return put(static_cast<float>(v));
    case DataType::kFloat64: return put(v);
    default: break;
  }
  const uint32_t code = refRound(formatOf(t), v);
  if (!(refValue(t, code) == v) || std::signbit(refValue(t, code)) != std::signbit(v))
    throw std::logic_error("encodeExact: " + std::to_string(v) + " is not exact in " + dataTypeName(t));
  std::memcpy(out, &code, dataTypeSize(t));  // little endian: the low bytes
}

// One element of t as a double (for messages and closed-form checks).
inline double decodeValue(DataType t, const void* in) {
  auto get = [&](auto x) {
    std::memcpy(&x, in, sizeof x);
    return static_cast<double>(x);
  };
  switch (t) {
    case DataType::kInt8: return get(int8_t{});
    case DataType::kUint8: return get(uint8_t{});
    case DataType::kInt32: return get(int32_t{});
    case DataType::kUint32: return get(uint32_t{});
    case DataType::kInt64: return get(int64_t{});
    case DataType::kUint64: return get(uint64_t{});
    case DataType::kFloat32: return get(float{});
    case DataType::kFloat64: return get(double{});
    default: break;
  }
  uint32_t code = 0;
  std::memcpy(&code, in, dataTypeSize(t));
  return refValue(t, code);
}

}  // namespace shoal::testing
