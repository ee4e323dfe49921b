// The reducer: element-wise combining and scaling of host buffers.
//
// Role: the engine's Reduce/Copy/Divide steps call these on host memory. Pure
// functions over raw buffers; thread-safe; no allocation. Vectorized with
// run-time dispatch (AVX-512 / AVX2 / scalar) for every data type.
//
// Numerics (NCCL's, reference/nccl-compat.md §5.6, §7.6):
//   half, bfloat16 and fp8 are combined in float and rounded back to the type
//   with round-to-nearest-even (fp8: saturating to the largest finite value is
//   NOT done; overflow gives inf for e5m2 and NaN for e4m3, as CUDA's
//   __nv_cvt_float_to_fp8 with __NV_NOSAT). Sum/prod/max/min of two values is
//   exactly what the type's arithmetic gives; integer arithmetic wraps.
//   kPreMulSum: dst = a * scalar + b, computed as (a*scalar) rounded to the type,
//   then + b rounded to the type (two roundings, like NCCL's premul then sum).
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
// the type). dst may equal src.
void divide(DataType dtype, void* dst, const void* src, size_t count, uint64_t divisor);

// Converts a double to one element of dtype (round-to-nearest-even), e.g. the
// 1/nranks scalar of ncclAvg. `out` must hold dataTypeSize(dtype) bytes.
void fromDouble(DataType dtype, double value, void* out);
// Reads one element of dtype as double (tests, diagnostics).
double toDouble(DataType dtype, const void* in);

// The instruction set the dispatcher chose ("avx512", "avx2", "scalar").
const char* isaName();

}  // namespace shoal::reduce
