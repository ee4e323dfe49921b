// The reducer: element-wise combining and scaling of host buffers.
//
// Role: the engine's Reduce/Copy/Divide steps call these on host memory. Pure
// functions over raw buffers; thread-safe; no allocation. Vectorized with
// run-time dispatch (AVX-512 / AVX2 / scalar) for every data type.
//
// Numerics (NCCL's, docs/nccl-compat.md "Numerics"; bit-exact where nccl-tests
// demands it; numerics.h has the conversions):
//   half, bfloat16 and fp8 are combined in float and rounded back to the type
//   with round-to-nearest-even, subnormals included. One operation in float
//   then one rounding equals the correctly rounded result in the type (float
//   has more than 2p+2 bits), i.e. what NCCL's __hadd/__hmul give.
//   Overflow gives inf for half and bf16. fp8 saturates like NCCL's device code
//   (src/device/reduce_kernel.h rounds with the __nv_fp8_e4m3/e5m2
//   constructors, __NV_SATFINITE): overflow and inf give +-max finite
//   (kFp8Saturate in numerics.h; false would give CUDA's __NV_NOSAT behaviour).
//   Sum/prod of two values is exactly what the type's arithmetic gives;
//   integer arithmetic wraps (two's complement).
//   kPreMulSum: dst = a * scalar + b, computed as (a*scalar) rounded to the type,
//   then + b rounded to the type (two roundings, like NCCL's premul then sum);
//   never an FMA, for float and double too.
//   NaN: any NaN result of sum/prod/premulsum/scale is the type's canonical
//   positive NaN (float 0x7FFFFFFF, double 0x7FFFFFFFFFFFFFFF, half and bf16
//   0x7FFF, fp8 0x7F), as the GPU produces.
//   Max/min of floating types (fmaxf/fminf-like, as NCCL's device code):
//   a NaN operand is ignored, two NaNs give the canonical NaN, and -0 < +0;
//   otherwise the result is one operand, bit for bit.
//   Float arithmetic follows the caller's MXCSR (FTZ/DAZ if set; default IEEE);
//   conversions do not depend on it. Every instruction-set path gives the
//   same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/types.h"

namespace shoal::reduce {

// dst[i] = op(a[i], b[i]) for i < count. For kPreMulSum: a[i]*scalar + b[i],
// where `scalar` points to one element of `dtype` (ignored for other ops).
// dst may be equal to a or b (not partially overlapping).
void combine(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, size_t count,
             const void* scalar = nullptr);

// dst[i] = src[i] * scalar (one element of dtype). dst may equal src.
void scale(DataType dtype, void* dst, const void* src, size_t count, const void* scalar);

// dst[i] = src[i] / divisor for integer types (truncating, signed or unsigned as
// the type; the engine's post-division of ncclAvg on integers). For floating
// types, the correctly rounded quotient. divisor > 0. dst may equal src.
void divide(DataType dtype, void* dst, const void* src, size_t count, uint64_t divisor);

// Converts a double to one element of dtype (round-to-nearest-even, rounded
// once), e.g. the 1/nranks scalar of ncclAvg. Integers: nearest, ties to even,
// saturated to the type's range, NaN -> 0. NaN -> canonical NaN. `out` must hold
// dataTypeSize(dtype) bytes. (NCCL computes the half/bf16 avg scalar as
// float(1.0/n) first: pass double(float(1.0/n)) to get its exact bits.)
void fromDouble(DataType dtype, double value, void* out);
// dst = src, `bytes` long (the ranges may overlap). Copies of at least
// kStreamingCopyMinBytes that do not overlap bypass the cache with
// non-temporal stores: so large a destination is not read again soon, and
// writing around the cache saves reading each line in first (on the
// development VM one core copies 32 MiB at ~16 GB/s with memcpy, ~20 with
// streaming stores; glibc streams only above 3/4 of the L3 it is told of,
// and this VM reports the whole socket's 508 MiB).
inline constexpr size_t kStreamingCopyMinBytes = size_t{4} << 20;
void copy(void* dst, const void* src, size_t bytes);

// Reads one element of dtype as double (tests, diagnostics).
double toDouble(DataType dtype, const void* in);

// The instruction set the dispatcher chose ("avx512", "avx2", "scalar").
const char* isaName();

}  // namespace shoal::reduce
