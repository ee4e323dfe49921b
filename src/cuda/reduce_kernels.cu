// The device reduction kernels: dst[i] = op(a[i], b[i]) for the 12 data types
// x 6 operators (sum, prod, max, min, premulsum, avg), one extern "C" kernel
// each, named shoal_reduce_<op>_<type> (element_ops.h lists both sets).
//
// The per-element arithmetic is element_ops.h's, the same functions the host
// scalar reducer runs, so the host reducer is the bit-exact reference; float
// arithmetic goes through addRn/mulRn (__fadd_rn, __fmul_rn, ...), so
// premulsum and avg stay two roundings: a ctest checks that the PTX has no
// fma and no float add/mul without a rounding modifier
// (tests/cudafake/ptx_rounding_check.cmake).
//
// Built by nvcc at build time into one fatbin (sm_90 code and compute_90
// PTX), embedded in libnccl.so.2, loaded through the driver API by
// DeviceReducer (device_reducer.h), which also picks the launch shape.
//
// Shape: a grid-stride loop. When dst, a and b sit at the same offset within
// 16 bytes, the few elements before the first 16-byte boundary go one by one,
// then 16-byte packs, up to four per thread in flight (kUnroll; all loads
// before any store: dst may be a or b, and each element is read and written
// by one thread only), then the tail one by one. Otherwise every element goes
// one by one.
//
// Parameters of every kernel:
//   (void* dst, const void* a, const void* b, unsigned long long count,
//    const void* scalar, unsigned long long scalarBits)
// premulsum and floating avg multiply a by s: the element at `scalar` (device
// memory, read when the kernel runs: ncclScalarDevice) when it is not null,
// else the element held in the low bytes of scalarBits. Integer avg divides
// by scalarBits (> 0).
#include <cstdint>

#include "reduce/element_ops.h"

namespace shoal::reduce {
namespace {

constexpr int kPackBytes = 16;
// Packs in flight per thread: 4 for 4- and 8-byte types; fewer for the small
// ones, whose packs hold 8 or 16 elements of costlier arithmetic (each copy
// of the loop body is inlined; a grid of several blocks per SM keeps enough
// loads in flight).
template <class S>
constexpr int kUnroll = sizeof(S) >= 4 ? 4 : int(sizeof(S));

template <class S>
__device__ __forceinline__ S elementFromBits(unsigned long long bits) {
  S v;
  memcpy(&v, &bits, sizeof v);  // little-endian: the low bytes
  return v;
}

template <class S>
union Pack {
  uint4 raw;
  S e[kPackBytes / sizeof(S)];
};

template <class Ty, ElementOp kOp>
__device__ __forceinline__ uint4 applyPack(uint4 x, uint4 y, ElementScalar<typename Ty::S> s) {
  using S = typename Ty::S;
  Pack<S> px, py, pr;
  px.raw = x;
  py.raw = y;
#pragma unroll
  for (int k = 0; k < int(kPackBytes / sizeof(S)); ++k)
    pr.e[k] = applyElement<Ty, kOp>(px.e[k], py.e[k], s);
  return pr.raw;
}

template <class Ty, ElementOp kOp>
__device__ __forceinline__ void reduceRange(void* dstv, const void* av, const void* bv,
                                            unsigned long long count, const void* scalarPtr,
                                            unsigned long long scalarBits) {
  using S = typename Ty::S;
  ElementScalar<S> s;
  if constexpr (kOp == ElementOp::kPreMulSum || (kOp == ElementOp::kAvg && Ty::kFloating)) {
    s.value = scalarPtr != nullptr ? *static_cast<const S*>(scalarPtr) : elementFromBits<S>(scalarBits);
  }
  if constexpr (kOp == ElementOp::kAvg && !Ty::kFloating) s.divisor = scalarBits;

  S* dst = static_cast<S*>(dstv);
  const S* a = static_cast<const S*>(av);
  const S* b = static_cast<const S*>(bv);
  const uint64_t tid = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;

  // Elements before the first 16-byte boundary (all of them when the three
  // pointers are not at the same offset within 16 bytes).
  const uintptr_t offset = reinterpret_cast<uintptr_t>(dst) % kPackBytes;
  const bool packs = offset == reinterpret_cast<uintptr_t>(a) % kPackBytes &&
                     offset == reinterpret_cast<uintptr_t>(b) % kPackBytes;
  uint64_t head = count;
  if (packs) {
    head = offset == 0 ? 0 : (kPackBytes - offset) / sizeof(S);
    if (head > count) head = count;
  }
#pragma unroll 1
  for (uint64_t i = tid; i < head; i += stride) dst[i] = applyElement<Ty, kOp>(a[i], b[i], s);

  constexpr uint64_t kPerPack = kPackBytes / sizeof(S);
  const uint64_t nPacks = (count - head) / kPerPack;
  uint4* pd = reinterpret_cast<uint4*>(dst + head);
  const uint4* pa = reinterpret_cast<const uint4*>(a + head);
  const uint4* pb = reinterpret_cast<const uint4*>(b + head);
  constexpr int kU = kUnroll<S>;
  uint64_t p = tid;
  if constexpr (kU > 1) {
#pragma unroll 1
    for (; p + (kU - 1) * stride < nPacks; p += kU * stride) {
      uint4 x[kU], y[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        x[u] = pa[p + u * stride];
        y[u] = pb[p + u * stride];
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) pd[p + u * stride] = applyPack<Ty, kOp>(x[u], y[u], s);
    }
  }
#pragma unroll 1
  for (; p < nPacks; p += stride) pd[p] = applyPack<Ty, kOp>(pa[p], pb[p], s);

#pragma unroll 1
  for (uint64_t i = head + nPacks * kPerPack + tid; i < count; i += stride)
    dst[i] = applyElement<Ty, kOp>(a[i], b[i], s);
}

}  // namespace
}  // namespace shoal::reduce

#define SHOAL_REDUCE_KERNEL(opName, opEnum, typeName, Ty)                                      \
  extern "C" __global__ void __launch_bounds__(::shoal::reduce::kReduceKernelThreads)          \
      shoal_reduce_##opName##_##typeName(void* dst, const void* a, const void* b,              \
                                         unsigned long long count, const void* scalar,         \
                                         unsigned long long scalarBits) {                      \
    ::shoal::reduce::reduceRange<Ty, ::shoal::reduce::ElementOp::opEnum>(dst, a, b, count,     \
                                                                         scalar, scalarBits);  \
  }
// One kernel per operator of SHOAL_ELEMENT_OPS (the loader resolves every
// name of both lists, so a kernel left out here fails every device test).
#define SHOAL_REDUCE_KERNELS_OF_TYPE(typeName, dtype, Ty) \
  SHOAL_REDUCE_KERNEL(sum, kSum, typeName, Ty)            \
  SHOAL_REDUCE_KERNEL(prod, kProd, typeName, Ty)          \
  SHOAL_REDUCE_KERNEL(max, kMax, typeName, Ty)            \
  SHOAL_REDUCE_KERNEL(min, kMin, typeName, Ty)            \
  SHOAL_REDUCE_KERNEL(premulsum, kPreMulSum, typeName, Ty) \
  SHOAL_REDUCE_KERNEL(avg, kAvg, typeName, Ty)

SHOAL_ELEMENT_TYPES(SHOAL_REDUCE_KERNELS_OF_TYPE)
