// DeviceReducer: the device reduction kernels of one CUDA context, and the
// launch helper of device plans: dst[i] = op(a[i], b[i]) on device memory, in
// the order of a stream.
//
// Role: a building block of the GPU path (docs/cuda.md, "Device reduction
// kernels"). The kernels (reduce_kernels.cu) are one fatbin embedded in
// libnccl.so.2; the first use in a context loads it and resolves every one
// of its kernels at once, fully loaded (Driver::moduleFunction): a kernel
// loaded lazily during a collective can deadlock. A kernel missing from the
// image fails the load, naming the kernel.
//
// Numerics: element_ops.h's functions, which the host reducer runs too, so
// the host reducer (reduce.h) is the bit-exact reference:
//   sum, prod, max, min, premulsum   = reduce::combine with the same op
//   avg, floating types              = reduce::combine(kPreMulSum) with the
//                                      type's 1/n (ReduceScalar::avg)
//   avg, integer types               = reduce::combine(kSum), then
//                                      reduce::divide by n
//
// Threading: a DeviceReducer is immutable once loaded; launch may be called
// from any thread whose current context is the reducer's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/status.h"
#include "core/types.h"
#include "cuda/driver.h"
#include "reduce/element_ops.h"

namespace shoal::cuda {

using reduce::ElementOp;

// The scalar operand of premulsum and avg.
struct ReduceScalar {
  // premulsum and floating avg: one element of the data type, in the low
  // bytes (little-endian); integer avg: the divisor n (> 0).
  uint64_t bits = 0;
  // premulsum only: one element in device memory, read when the kernel runs
  // (ncclScalarDevice); when set, `bits` is ignored.
  const void* device = nullptr;

  // One element of dtype, copied from host memory.
  static ReduceScalar element(DataType dtype, const void* value);
  // ncclAvg over n ranks, as Shoal lowers it on the host: floating types
  // multiply by the type's 1/n (formed in float, in double for double, as
  // NCCL does); integers divide by n.
  static ReduceScalar avg(DataType dtype, int nranks);
  // premulsum with the scalar in device memory.
  static ReduceScalar onDevice(const void* element);
};

class DeviceReducer {
 public:
  // Threads per block of every launch (the kernels' __launch_bounds__).
  static constexpr unsigned kThreads = reduce::kReduceKernelThreads;

  // The reducer of the calling thread's current context, loaded (and every
  // kernel resolved) by the first call in that context. A failed load is
  // remembered: later calls return the same error without trying again.
  static Result<const DeviceReducer*> forCurrentContext(Driver& driver);
  // Loads a new reducer in the current context, uncached (tests).
  static Result<std::unique_ptr<DeviceReducer>> load(Driver& driver);
  // Whether this library carries the kernels (nvcc was found at build time).
  static bool built();
  // The kernel names, shoal_reduce_<op>_<type>.
  static std::string kernelName(DataType dtype, ElementOp op);

  ~DeviceReducer();
  DeviceReducer(const DeviceReducer&) = delete;
  DeviceReducer& operator=(const DeviceReducer&) = delete;

  // Enqueues dst[i] = op(a[i], b[i]) for i < count on `stream`. dst may equal
  // a or b; the buffers are device memory of this context (or memory the
  // device can address), aligned to the element size. count 0 enqueues
  // nothing. Bad arguments (an unknown type or operator, a null or
  // misaligned buffer, integer avg without a divisor, a device scalar for
  // anything but premulsum) are kInvalidArgument with the reason.
  Status launch(void* dst, const void* a, const void* b, size_t count, DataType dtype,
                ElementOp op, const ReduceScalar& scalar, StreamHandle stream) const;

  // Blocks a launch over `bytes` uses: one per 64 KiB (short reductions
  // start fewer blocks and finish sooner), at most four per multiprocessor
  // (2048 threads, a full SM: the grid-stride loop covers the rest), at least 1.
  unsigned blocksFor(size_t bytes) const;
  int multiprocessors() const { return multiprocessors_; }

 private:
  DeviceReducer(Driver& driver, ModuleHandle module, int multiprocessors)
      : driver_(driver), module_(module), multiprocessors_(multiprocessors) {}

  Driver& driver_;
  ModuleHandle module_;
  int multiprocessors_;
  FunctionHandle kernels_[reduce::kNumElementOps][kNumDataTypes] = {};
};

}  // namespace shoal::cuda
