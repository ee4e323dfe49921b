// The scalar path: one element at a time, portable C++. It is the reference
// the vector paths must match bit for bit, and the path used on CPUs without
// AVX2. Its element arithmetic is element_ops.h's, the same functions the
// device reduction kernels run. Compiled with -ffp-contract=off (see
// CMakeLists.txt): a*s+b is two roundings, never an FMA.
//
// Elements are read and written through memcpy so that any byte alignment
// works and the compiler can assume none.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "reduce/element_ops.h"
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
// The element arithmetic is element_ops.h's, shared with the device kernels.

constexpr ElementOp elementOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ElementOp::kSum;
    case ReduceOp::kProd: return ElementOp::kProd;
    case ReduceOp::kMax: return ElementOp::kMax;
    case ReduceOp::kMin: return ElementOp::kMin;
    case ReduceOp::kPreMulSum: return ElementOp::kPreMulSum;
  }
  return ElementOp::kSum;
}

// ---- Kernels ---------------------------------------------------------------

template <class Ty, ReduceOp kOp>
void combineKernel(void* dst, const void* a, const void* b, size_t n, const void* scalar) {
  using S = typename Ty::S;
  auto* d = static_cast<unsigned char*>(dst);
  auto* pa = static_cast<const unsigned char*>(a);
  auto* pb = static_cast<const unsigned char*>(b);
  ElementScalar<S> s{};
  if constexpr (kOp == ReduceOp::kPreMulSum) std::memcpy(&s.value, scalar, sizeof s.value);
  for (size_t i = 0; i < n; ++i)
    st<S>(d, i, applyElement<Ty, elementOp(kOp)>(ld<S>(pa, i), ld<S>(pb, i), s));
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
  for (size_t i = 0; i < n; ++i) st<T>(d, i, divideInt<T>(ld<T>(p, i), divisor));
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
  fillType<IntOps<int8_t>>(k, DataType::kInt8);
  fillType<IntOps<uint8_t>>(k, DataType::kUint8);
  fillType<IntOps<int32_t>>(k, DataType::kInt32);
  fillType<IntOps<uint32_t>>(k, DataType::kUint32);
  fillType<IntOps<int64_t>>(k, DataType::kInt64);
  fillType<IntOps<uint64_t>>(k, DataType::kUint64);
  fillType<HalfOps>(k, DataType::kFloat16);
  fillType<Float32Ops>(k, DataType::kFloat32);
  fillType<Float64Ops>(k, DataType::kFloat64);
  fillType<Bf16Ops>(k, DataType::kBfloat16);
  fillType<E4m3Ops>(k, DataType::kFloat8e4m3);
  fillType<E5m2Ops>(k, DataType::kFloat8e5m2);

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
