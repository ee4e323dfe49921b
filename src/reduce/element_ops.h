// The reducer's per-element arithmetic, written once for the host and the GPU.
//
// Role: the host scalar reducer (reduce_scalar.cc) and the device reduction
// kernels (src/cuda/reduce_kernels.cu) both call these functions, and the
// CUDA stand-in (tests/cudafake) runs the kernels with them compiled for the
// host, so the CPU tests in CI test the arithmetic the kernels run. The SIMD
// paths implement the same rules on vectors and are checked against the
// scalar path bit for bit (tests/unit/reduce_test.cc).
//
// Numerics: reduce.h. In short: integers wrap; float and double round once
// per operation (addRn/mulRn: never a fused multiply-add, on either side);
// half, bfloat16 and fp8 are computed in float and rounded back once
// (numerics.h, fp8 saturating); NaN results are canonical; max/min ignore a
// NaN operand and order -0 below +0. PreMulSum is two roundings:
// round(round(a * s) + b).
//
// Pure inline functions of values; no state; safe anywhere.
#pragma once

#include <cstdint>
#include <type_traits>

#include "reduce/host_device.h"
#include "reduce/numerics.h"

namespace shoal::reduce {

// What one reduction kernel computes per element, dst = op(a, b):
//   kSum, kProd, kMax, kMin   as the reducer's ReduceOp
//   kPreMulSum                a * s + b (s: one element of the type)
//   kAvg                      the last step of ncclAvg as Shoal lowers it:
//                             floating types a * s + b with s = the type's
//                             1/n (as kPreMulSum); integers (a + b) / n,
//                             truncating, with n given as the divisor.
enum class ElementOp : uint8_t { kSum, kProd, kMax, kMin, kPreMulSum, kAvg };
inline constexpr int kNumElementOps = 6;

// The scalar operand of kPreMulSum and kAvg.
template <class S>
struct ElementScalar {
  S value{};             // kPreMulSum, floating kAvg
  uint64_t divisor = 1;  // integer kAvg (> 0)
};

// Max/min of floating values compared through their codes (the raw bits as a
// signed integer I): NaN operands are ignored, two NaNs give the canonical NaN,
// -0 < +0. The result is always one operand's exact bits (or canonical NaN).
template <class I>
SHOAL_HOST_DEVICE inline I codeMaxMin(I a, I b, I absMask, I nanAbove, I canon, bool isMax) {
  const bool an = I(a & absMask) > nanAbove;
  const bool bn = I(b & absMask) > nanAbove;
  if (an && bn) return canon;
  if (an) return b;
  if (bn) return a;
  const I ka = I(a ^ (a < 0 ? absMask : I(0)));
  const I kb = I(b ^ (b < 0 ? absMask : I(0)));
  if (isMax) return ka >= kb ? a : b;
  return ka <= kb ? a : b;
}

// Each element type gives the storage type S and the element functions on
// storage values: sum, prod, max, min, mul (a*s, the pre-multiplication).

// Integers: wrap-around arithmetic done in the unsigned twin (no UB).
template <class T>
struct IntOps {
  using S = T;
  using U = std::make_unsigned_t<T>;
  static constexpr bool kFloating = false;
  SHOAL_HOST_DEVICE static S sum(S a, S b) { return S(U(U(a) + U(b))); }
  SHOAL_HOST_DEVICE static S prod(S a, S b) { return S(U(U(a) * U(b))); }
  SHOAL_HOST_DEVICE static S mul(S a, S s) { return prod(a, s); }
  SHOAL_HOST_DEVICE static S max(S a, S b) { return a > b ? a : b; }
  SHOAL_HOST_DEVICE static S min(S a, S b) { return a < b ? a : b; }
};

// x / divisor, truncating, as the type (signed or unsigned); divisor > 0.
// The post-division of ncclAvg on integers.
template <class T>
SHOAL_HOST_DEVICE inline T divideInt(T x, uint64_t divisor) {
  if constexpr (std::is_unsigned_v<T>) {
    return T(uint64_t(x) / divisor);
  } else {
    constexpr uint64_t kInt64Max = 0x7FFFFFFFFFFFFFFFull;
    constexpr int64_t kInt64Min = int64_t(-kInt64Max - 1);
    if (divisor > kInt64Max) {
      // |x| <= 2^63 <= divisor: only -2^63 / 2^63 is nonzero.
      return (int64_t(x) == kInt64Min && divisor == (1ull << 63)) ? T(-1) : T(0);
    }
    return T(int64_t(x) / int64_t(divisor));
  }
}

// float (F = float, I = int32_t) and double (F = double, I = int64_t):
// one rounding per operation; NaN results become the canonical NaN.
template <class F, class I>
struct FloatOps {
  using S = F;
  static constexpr bool kFloating = true;
  static constexpr I kAbs = sizeof(F) == 4 ? I(0x7FFFFFFF) : I(0x7FFFFFFFFFFFFFFFll);
  static constexpr I kInf = sizeof(F) == 4 ? I(0x7F800000) : I(0x7FF0000000000000ll);
  static constexpr I kCanon = kAbs;
  SHOAL_HOST_DEVICE static I code(S v) {
    if constexpr (sizeof(F) == 4) {
      return I(floatBits(v));
    } else {
      return I(doubleBits(v));
    }
  }
  SHOAL_HOST_DEVICE static S value(I c) {
    if constexpr (sizeof(F) == 4) {
      return bitsFloat(uint32_t(c));
    } else {
      return bitsDouble(uint64_t(c));
    }
  }
  SHOAL_HOST_DEVICE static S canon(S r) { return r != r ? value(kCanon) : r; }
  SHOAL_HOST_DEVICE static S sum(S a, S b) { return canon(addRn(a, b)); }
  SHOAL_HOST_DEVICE static S prod(S a, S b) { return canon(mulRn(a, b)); }
  SHOAL_HOST_DEVICE static S mul(S a, S s) { return canon(mulRn(a, s)); }
  SHOAL_HOST_DEVICE static S mm(S a, S b, bool isMax) {
    return value(codeMaxMin<I>(code(a), code(b), kAbs, kInf, kCanon, isMax));
  }
  SHOAL_HOST_DEVICE static S max(S a, S b) { return mm(a, b, true); }
  SHOAL_HOST_DEVICE static S min(S a, S b) { return mm(a, b, false); }
};

// The small formats' codecs (numerics.h): code <-> float.
// kInfToFinite: the code of +inf where max/min give the largest finite
// value instead (NCCL takes fp8 max/min in half and converts back
// saturating, __NV_SATFINITE), else -1.
struct HalfCodec {
  using C = uint16_t;
  using I = int16_t;
  static constexpr int kAbs = 0x7FFF, kNanAbove = 0x7C00, kCanon = 0x7FFF, kInfToFinite = -1;
  SHOAL_HOST_DEVICE static float toFloat(C c) { return halfToFloat(c); }
  SHOAL_HOST_DEVICE static C fromFloat(float f) { return floatToHalf(f); }
};
struct Bf16Codec {
  using C = uint16_t;
  using I = int16_t;
  static constexpr int kAbs = 0x7FFF, kNanAbove = 0x7F80, kCanon = 0x7FFF, kInfToFinite = -1;
  SHOAL_HOST_DEVICE static float toFloat(C c) { return bf16ToFloat(c); }
  SHOAL_HOST_DEVICE static C fromFloat(float f) { return floatToBf16(f); }
};
struct E4m3Codec {
  using C = uint8_t;
  using I = int8_t;
  static constexpr int kAbs = 0x7F, kNanAbove = 0x7E, kCanon = 0x7F, kInfToFinite = -1;  // no inf
  SHOAL_HOST_DEVICE static float toFloat(C c) { return e4m3ToFloat(c); }
  SHOAL_HOST_DEVICE static C fromFloat(float f) { return floatToE4m3(f); }
};
struct E5m2Codec {
  using C = uint8_t;
  using I = int8_t;
  static constexpr int kAbs = 0x7F, kNanAbove = 0x7C, kCanon = 0x7F, kInfToFinite = 0x7C;
  SHOAL_HOST_DEVICE static float toFloat(C c) { return e5m2ToFloat(c); }
  SHOAL_HOST_DEVICE static C fromFloat(float f) { return floatToE5m2(f); }
};

// half, bfloat16, fp8: computed in float (exact for one op: float has more
// than 2p+2 bits, so rounding twice is the same as rounding once), rounded back.
template <class Codec>
struct SmallOps {
  using S = typename Codec::C;
  using I = typename Codec::I;
  static constexpr bool kFloating = true;
  SHOAL_HOST_DEVICE static S sum(S a, S b) {
    return Codec::fromFloat(addRn(Codec::toFloat(a), Codec::toFloat(b)));
  }
  SHOAL_HOST_DEVICE static S prod(S a, S b) {
    return Codec::fromFloat(mulRn(Codec::toFloat(a), Codec::toFloat(b)));
  }
  SHOAL_HOST_DEVICE static S mul(S a, S s) { return prod(a, s); }
  SHOAL_HOST_DEVICE static S mm(S a, S b, bool isMax) {
    const S r = S(codeMaxMin<I>(I(a), I(b), I(Codec::kAbs), I(Codec::kNanAbove), I(Codec::kCanon), isMax));
    if constexpr (Codec::kInfToFinite >= 0) {
      if ((r & Codec::kAbs) == Codec::kInfToFinite) return S(r - 1);  // +-inf -> +-largest finite
    }
    return r;
  }
  SHOAL_HOST_DEVICE static S max(S a, S b) { return mm(a, b, true); }
  SHOAL_HOST_DEVICE static S min(S a, S b) { return mm(a, b, false); }
};

using Float32Ops = FloatOps<float, int32_t>;
using Float64Ops = FloatOps<double, int64_t>;
using HalfOps = SmallOps<HalfCodec>;
using Bf16Ops = SmallOps<Bf16Codec>;
using E4m3Ops = SmallOps<E4m3Codec>;
using E5m2Ops = SmallOps<E5m2Codec>;

// dst = op(x, y) for one element: the one definition both the host reducer
// and the device kernels use.
template <class Ty, ElementOp kOp>
SHOAL_HOST_DEVICE inline typename Ty::S applyElement(typename Ty::S x, typename Ty::S y,
                                                     ElementScalar<typename Ty::S> s) {
  if constexpr (kOp == ElementOp::kSum) return Ty::sum(x, y);
  if constexpr (kOp == ElementOp::kProd) return Ty::prod(x, y);
  if constexpr (kOp == ElementOp::kMax) return Ty::max(x, y);
  if constexpr (kOp == ElementOp::kMin) return Ty::min(x, y);
  if constexpr (kOp == ElementOp::kPreMulSum) return Ty::sum(Ty::mul(x, s.value), y);
  if constexpr (kOp == ElementOp::kAvg) {
    if constexpr (Ty::kFloating) {
      return Ty::sum(Ty::mul(x, s.value), y);
    } else {
      return divideInt<typename Ty::S>(Ty::sum(x, y), s.divisor);
    }
  }
}

// The 12 data types (in DataType's order) and the 6 operators, with the names
// the device kernels carry: shoal_reduce_<op>_<type>. X-macro lists, so the
// kernels (.cu), their loader and the CUDA stand-in enumerate the same set.
//   SHOAL_ELEMENT_TYPES(X): X(type name, DataType enumerator, element ops)
//   SHOAL_ELEMENT_OPS(X):   X(op name, ElementOp enumerator)
#define SHOAL_ELEMENT_TYPES(X)                                                        \
  X(int8, kInt8, ::shoal::reduce::IntOps<int8_t>)                                     \
  X(uint8, kUint8, ::shoal::reduce::IntOps<uint8_t>)                                  \
  X(int32, kInt32, ::shoal::reduce::IntOps<int32_t>)                                  \
  X(uint32, kUint32, ::shoal::reduce::IntOps<uint32_t>)                               \
  X(int64, kInt64, ::shoal::reduce::IntOps<int64_t>)                                  \
  X(uint64, kUint64, ::shoal::reduce::IntOps<uint64_t>)                               \
  X(half, kFloat16, ::shoal::reduce::HalfOps)                                         \
  X(float, kFloat32, ::shoal::reduce::Float32Ops)                                    \
  X(double, kFloat64, ::shoal::reduce::Float64Ops)                                    \
  X(bfloat16, kBfloat16, ::shoal::reduce::Bf16Ops)                                    \
  X(f8e4m3, kFloat8e4m3, ::shoal::reduce::E4m3Ops)                                    \
  X(f8e5m2, kFloat8e5m2, ::shoal::reduce::E5m2Ops)
#define SHOAL_ELEMENT_OPS(X) \
  X(sum, kSum) X(prod, kProd) X(max, kMax) X(min, kMin) X(premulsum, kPreMulSum) X(avg, kAvg)

// The names in those lists, indexed by DataType and ElementOp (host code:
// the kernels' loader and the CUDA stand-in). A kernel is named
// "shoal_reduce_" + op name + "_" + type name.
#define SHOAL_ELEMENT_NAME_OF_TYPE(name, dtype, Ty) #name,
#define SHOAL_ELEMENT_NAME_OF_OP(name, op) #name,
inline constexpr const char* kElementTypeNames[] = {SHOAL_ELEMENT_TYPES(SHOAL_ELEMENT_NAME_OF_TYPE)};
inline constexpr const char* kElementOpNames[] = {SHOAL_ELEMENT_OPS(SHOAL_ELEMENT_NAME_OF_OP)};
#undef SHOAL_ELEMENT_NAME_OF_TYPE
#undef SHOAL_ELEMENT_NAME_OF_OP
#define SHOAL_ELEMENT_OP_ENUM(name, op) ElementOp::op,
inline constexpr ElementOp kElementOpsInListOrder[] = {SHOAL_ELEMENT_OPS(SHOAL_ELEMENT_OP_ENUM)};
#undef SHOAL_ELEMENT_OP_ENUM
static_assert(sizeof kElementOpNames / sizeof kElementOpNames[0] == kNumElementOps);
static_assert([] {
  for (int i = 0; i < kNumElementOps; ++i)
    if (int(kElementOpsInListOrder[i]) != i) return false;
  return true;
}(), "SHOAL_ELEMENT_OPS lists the operators in ElementOp's order");
inline constexpr const char* kReduceKernelPrefix = "shoal_reduce_";
// Threads per block of every reduction kernel launch (the kernels'
// __launch_bounds__; the CUDA stand-in refuses more).
inline constexpr unsigned kReduceKernelThreads = 512;

}  // namespace shoal::reduce
