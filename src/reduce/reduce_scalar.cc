// The scalar path: one element at a time, portable C++. It is the reference
// the vector paths must match bit for bit, and the path used on CPUs without
// AVX2. Compiled with -ffp-contract=off (see CMakeLists.txt): a*s+b is two
// roundings, never an FMA.
//
// Elements are read and written through memcpy so that any byte alignment
// works and the compiler can assume none.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "reduce/numerics.h"
#include "reduce/reduce_internal.h"

namespace shoal::reduce {
namespace {

template <class S>
inline S ld(const unsigned char* p, size_t i) {
  S v;
  std::memcpy(&v, p + i * sizeof(S), sizeof(S));
  return v;
}
template <class S>
inline void st(unsigned char* p, size_t i, S v) {
  std::memcpy(p + i * sizeof(S), &v, sizeof(S));
}

// ---- Element types ---------------------------------------------------------
// Each type descriptor gives the storage type S and element functions on
// storage values: sum, prod, max, min, mul (a*s, the pre-multiplication).

// Integers: wrap-around arithmetic done in the unsigned twin (no UB).
template <class T>
struct IntType {
  using S = T;
  using U = std::make_unsigned_t<T>;
  static S sum(S a, S b) { return S(U(U(a) + U(b))); }
  static S prod(S a, S b) { return S(U(U(a) * U(b))); }
  static S mul(S a, S s) { return prod(a, s); }
  static S max(S a, S b) { return a > b ? a : b; }
  static S min(S a, S b) { return a < b ? a : b; }
};

// Max/min of floating values compared through their codes (the raw bits as a
// signed integer I): NaN operands are ignored, two NaNs give the canonical NaN,
// -0 < +0. The result is always one operand's exact bits (or canonical NaN).
template <class I>
inline I codeMaxMin(I a, I b, I absMask, I nanAbove, I canon, bool isMax) {
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

// float and double: native arithmetic; NaN results become the canonical NaN.
template <class F, class I>
struct FloatType {
  using S = F;
  static constexpr I kAbs = std::numeric_limits<I>::max();
  static constexpr I kInf = sizeof(F) == 4 ? I(0x7F800000) : I(0x7FF0000000000000ll);
  static constexpr I kCanon = kAbs;
  static S canon(S r) {
    if (r != r) {
      I c = kCanon;
      std::memcpy(&r, &c, sizeof r);
    }
    return r;
  }
  static S sum(S a, S b) { return canon(a + b); }
  static S prod(S a, S b) { return canon(a * b); }
  static S mul(S a, S s) { return canon(a * s); }
  static S mm(S a, S b, bool isMax) {
    I ia, ib;
    std::memcpy(&ia, &a, sizeof a);
    std::memcpy(&ib, &b, sizeof b);
    I r = codeMaxMin<I>(ia, ib, kAbs, kInf, kCanon, isMax);
    S s;
    std::memcpy(&s, &r, sizeof s);
    return s;
  }
  static S max(S a, S b) { return mm(a, b, true); }
  static S min(S a, S b) { return mm(a, b, false); }
};

// half, bfloat16, fp8: computed in float (exact for one op: float has more
// than 2p+2 bits, so rounding twice is the same as rounding once), rounded back.
template <class C, class I, float (*ToF)(C), C (*FromF)(float), int kAbsV, int kNanAboveV,
          int kCanonV>
struct SmallType {
  using S = C;
  static S sum(S a, S b) { return FromF(ToF(a) + ToF(b)); }
  static S prod(S a, S b) { return FromF(ToF(a) * ToF(b)); }
  static S mul(S a, S s) { return FromF(ToF(a) * ToF(s)); }
  static S mm(S a, S b, bool isMax) {
    return S(codeMaxMin<I>(I(a), I(b), I(kAbsV), I(kNanAboveV), I(kCanonV), isMax));
  }
  static S max(S a, S b) { return mm(a, b, true); }
  static S min(S a, S b) { return mm(a, b, false); }
};

using HalfType = SmallType<uint16_t, int16_t, halfToFloat, floatToHalf, 0x7FFF, 0x7C00, 0x7FFF>;
using Bf16Type = SmallType<uint16_t, int16_t, bf16ToFloat, floatToBf16, 0x7FFF, 0x7F80, 0x7FFF>;
using E4m3Type = SmallType<uint8_t, int8_t, e4m3ToFloat, floatToE4m3, 0x7F, 0x7E, 0x7F>;
using E5m2Type = SmallType<uint8_t, int8_t, e5m2ToFloat, floatToE5m2, 0x7F, 0x7C, 0x7F>;

// ---- Kernels ---------------------------------------------------------------

template <class Ty, ReduceOp kOp>
void combineKernel(void* dst, const void* a, const void* b, size_t n, const void* scalar) {
  using S = typename Ty::S;
  auto* d = static_cast<unsigned char*>(dst);
  auto* pa = static_cast<const unsigned char*>(a);
  auto* pb = static_cast<const unsigned char*>(b);
  S s{};
  if constexpr (kOp == ReduceOp::kPreMulSum) std::memcpy(&s, scalar, sizeof s);
  for (size_t i = 0; i < n; ++i) {
    const S x = ld<S>(pa, i);
    const S y = ld<S>(pb, i);
    S r;
    if constexpr (kOp == ReduceOp::kSum) r = Ty::sum(x, y);
    if constexpr (kOp == ReduceOp::kProd) r = Ty::prod(x, y);
    if constexpr (kOp == ReduceOp::kMax) r = Ty::max(x, y);
    if constexpr (kOp == ReduceOp::kMin) r = Ty::min(x, y);
    if constexpr (kOp == ReduceOp::kPreMulSum) r = Ty::sum(Ty::mul(x, s), y);
    st<S>(d, i, r);
  }
}

template <class Ty>
void scaleKernel(void* dst, const void* src, size_t n, const void* scalar) {
  using S = typename Ty::S;
  auto* d = static_cast<unsigned char*>(dst);
  auto* p = static_cast<const unsigned char*>(src);
  S s;
  std::memcpy(&s, scalar, sizeof s);
  for (size_t i = 0; i < n; ++i) st<S>(d, i, Ty::mul(ld<S>(p, i), s));
}

template <class T>
void divideIntKernel(void* dst, const void* src, size_t n, uint64_t divisor) {
  auto* d = static_cast<unsigned char*>(dst);
  auto* p = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; ++i) {
    const T x = ld<T>(p, i);
    T q;
    if constexpr (std::is_unsigned_v<T>) {
      q = T(uint64_t(x) / divisor);
    } else if (divisor > uint64_t(std::numeric_limits<int64_t>::max())) {
      // |x| <= 2^63 <= divisor: only -2^63 / 2^63 is nonzero.
      q = (int64_t(x) == std::numeric_limits<int64_t>::min() && divisor == (1ull << 63)) ? T(-1)
                                                                                         : T(0);
    } else {
      q = T(int64_t(x) / int64_t(divisor));
    }
    st<T>(d, i, q);
  }
}

// Floating types: the quotient in double, rounded once more to the type
// (double has > 2p+2 bits for every type here, so this is correctly rounded).
template <class S, double (*ToD)(S), S (*FromD)(double)>
void divideFloatKernel(void* dst, const void* src, size_t n, uint64_t divisor) {
  auto* d = static_cast<unsigned char*>(dst);
  auto* p = static_cast<const unsigned char*>(src);
  const double dv = double(divisor);
  for (size_t i = 0; i < n; ++i) st<S>(d, i, FromD(ToD(ld<S>(p, i)) / dv));
}

// Double -> float rounded to odd (truncate, then set the last bit if inexact):
// a later RNE rounding to a format with fewer than 22 bits is then the correct
// rounding of the double.
float doubleToFloatOdd(double v) {
  if (v != v) return bitsFloat(kFloatCanonicalNaN);
  float f = float(v);  // RNE
  if (double(f) == v) return f;
  uint32_t u = floatBits(f);
  if (std::fabs(double(f)) > std::fabs(v)) --u;  // step toward zero: truncation
  return bitsFloat(u | 1u);
}

double dHalf(uint16_t x) { return halfToFloat(x); }
double dBf16(uint16_t x) { return bf16ToFloat(x); }
double dE4m3(uint8_t x) { return e4m3ToFloat(x); }
double dE5m2(uint8_t x) { return e5m2ToFloat(x); }
double dFloat(float x) { return x; }
double dDouble(double x) { return x; }
uint16_t hFromD(double v) { return floatToHalf(doubleToFloatOdd(v)); }
uint16_t bFromD(double v) { return floatToBf16(doubleToFloatOdd(v)); }
uint8_t e4FromD(double v) { return floatToE4m3(doubleToFloatOdd(v)); }
uint8_t e5FromD(double v) { return floatToE5m2(doubleToFloatOdd(v)); }
float fFromD(double v) {
  const float f = float(v);
  return f != f ? bitsFloat(kFloatCanonicalNaN) : f;
}
double dFromD(double v) { return v != v ? bitsDouble(kDoubleCanonicalNaN) : v; }

template <class S, S (*FromF)(float)>
void fromFloatKernel(void* dst, const float* src, size_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, src + i, 4);
    st<S>(d, i, FromF(f));
  }
}
float fIdentity(float f) { return f != f ? bitsFloat(kFloatCanonicalNaN) : f; }

template <class Ty>
constexpr void fillType(Kernels& k, DataType t) {
  const int i = static_cast<int>(t);
  k.combine[int(ReduceOp::kSum)][i] = combineKernel<Ty, ReduceOp::kSum>;
  k.combine[int(ReduceOp::kProd)][i] = combineKernel<Ty, ReduceOp::kProd>;
  k.combine[int(ReduceOp::kMax)][i] = combineKernel<Ty, ReduceOp::kMax>;
  k.combine[int(ReduceOp::kMin)][i] = combineKernel<Ty, ReduceOp::kMin>;
  k.combine[int(ReduceOp::kPreMulSum)][i] = combineKernel<Ty, ReduceOp::kPreMulSum>;
  k.scale[i] = scaleKernel<Ty>;
}

Kernels makeScalarKernels() {
  Kernels k{};
  k.name = "scalar";
  fillType<IntType<int8_t>>(k, DataType::kInt8);
  fillType<IntType<uint8_t>>(k, DataType::kUint8);
  fillType<IntType<int32_t>>(k, DataType::kInt32);
  fillType<IntType<uint32_t>>(k, DataType::kUint32);
  fillType<IntType<int64_t>>(k, DataType::kInt64);
  fillType<IntType<uint64_t>>(k, DataType::kUint64);
  fillType<HalfType>(k, DataType::kFloat16);
  fillType<FloatType<float, int32_t>>(k, DataType::kFloat32);
  fillType<FloatType<double, int64_t>>(k, DataType::kFloat64);
  fillType<Bf16Type>(k, DataType::kBfloat16);
  fillType<E4m3Type>(k, DataType::kFloat8e4m3);
  fillType<E5m2Type>(k, DataType::kFloat8e5m2);

  k.divide[int(DataType::kInt8)] = divideIntKernel<int8_t>;
  k.divide[int(DataType::kUint8)] = divideIntKernel<uint8_t>;
  k.divide[int(DataType::kInt32)] = divideIntKernel<int32_t>;
  k.divide[int(DataType::kUint32)] = divideIntKernel<uint32_t>;
  k.divide[int(DataType::kInt64)] = divideIntKernel<int64_t>;
  k.divide[int(DataType::kUint64)] = divideIntKernel<uint64_t>;
  k.divide[int(DataType::kFloat16)] = divideFloatKernel<uint16_t, dHalf, hFromD>;
  k.divide[int(DataType::kFloat32)] = divideFloatKernel<float, dFloat, fFromD>;
  k.divide[int(DataType::kFloat64)] = divideFloatKernel<double, dDouble, dFromD>;
  k.divide[int(DataType::kBfloat16)] = divideFloatKernel<uint16_t, dBf16, bFromD>;
  k.divide[int(DataType::kFloat8e4m3)] = divideFloatKernel<uint8_t, dE4m3, e4FromD>;
  k.divide[int(DataType::kFloat8e5m2)] = divideFloatKernel<uint8_t, dE5m2, e5FromD>;

  k.fromFloat[int(DataType::kFloat16)] = fromFloatKernel<uint16_t, floatToHalf>;
  k.fromFloat[int(DataType::kFloat32)] = fromFloatKernel<float, fIdentity>;
  k.fromFloat[int(DataType::kBfloat16)] = fromFloatKernel<uint16_t, floatToBf16>;
  k.fromFloat[int(DataType::kFloat8e4m3)] = fromFloatKernel<uint8_t, floatToE4m3>;
  k.fromFloat[int(DataType::kFloat8e5m2)] = fromFloatKernel<uint8_t, floatToE5m2>;
  return k;
}

}  // namespace

const Kernels& scalarKernels() {
  static const Kernels k = makeScalarKernels();
  return k;
}

// Exposed to reduce.cc (declared there): double conversions with one rounding.
void scalarFromDouble(DataType dtype, double v, void* out) {
  switch (dtype) {
    case DataType::kFloat16: { uint16_t c = hFromD(v); std::memcpy(out, &c, 2); return; }
    case DataType::kBfloat16: { uint16_t c = bFromD(v); std::memcpy(out, &c, 2); return; }
    case DataType::kFloat8e4m3: { uint8_t c = e4FromD(v); std::memcpy(out, &c, 1); return; }
    case DataType::kFloat8e5m2: { uint8_t c = e5FromD(v); std::memcpy(out, &c, 1); return; }
    case DataType::kFloat32: { float f = fFromD(v); std::memcpy(out, &f, 4); return; }
    case DataType::kFloat64: { double d = dFromD(v); std::memcpy(out, &d, 8); return; }
    default: return;
  }
}

}  // namespace shoal::reduce
