// DevicePlanSteps: the compute steps and scratch of a communicator's device
// plans (docs/cuda.md, Device plans).
//
// Role: a device plan runs the communicator's unchanged host plan on the
// caller's device buffers: its sends and receives go to connections that move
// device memory (Transport::movesDeviceMemory), and its Reduce and Copy steps
// come here, where they run on the GPU (the reduction kernels,
// cuda::DeviceReducer; cuMemcpyAsync) on a stream of the communicator's
// context; each returns once its result is in device memory. The scratch
// the plans use is device memory too, grown on demand: a smaller one that a
// queued job may still use is kept until this object goes.
// Owner: the Communicator, shared with each device job (Job::deviceSteps),
// so it lives until the last one has finished.
// Thread: the engine calls reduce()/copy() for one job at a time (a
// communicator's jobs run in order); scratch() runs on the user's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/device_reducer.h"
#include "cuda/driver.h"
#include "engine/engine.h"

namespace shoal {

// The kernels' element operation of a plan's combine op (engine.h's combineOpOf).
reduce::ElementOp elementOpOf(ReduceOp op);

class DevicePlanSteps final : public DeviceSteps {
 public:
  // With the communicator's context current on the calling thread. Without
  // `computes`, scratch only (stream plans': they compute on their streams).
  static Result<std::shared_ptr<DevicePlanSteps>> make(cuda::Driver& driver, const cuda::DeviceReducer& reducer,
                                                       bool computes = true);
  ~DevicePlanSteps() override;

  Status reduce(ReduceOp op, DataType dtype, uint8_t* dst, const uint8_t* a, const uint8_t* b, uint64_t count,
                const void* scalar) override;
  Status copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) override;
  // Device scratch of at least `bytes` (the caller's context current).
  Result<uint8_t*> scratch(uint64_t bytes);

 private:
  DevicePlanSteps(cuda::Driver& driver, const cuda::DeviceReducer& reducer, cuda::ContextHandle context,
                  cuda::StreamHandle stream)
      : driver_(driver), reducer_(reducer), context_(context), stream_(stream) {}
  // Runs `enqueue` on the stream with the context current and waits for it.
  template <typename Enqueue>
  Status runAndWait(Enqueue enqueue);
  void freeScratch(uint8_t* p, uint64_t bytes);

  cuda::Driver& driver_;
  const cuda::DeviceReducer& reducer_;
  cuda::ContextHandle context_;
  cuda::StreamHandle stream_;  // null: scratch only
  std::mutex scratchMutex_;
  uint8_t* scratch_ = nullptr;
  uint64_t scratchBytes_ = 0;
  std::vector<std::pair<uint8_t*, uint64_t>> retired_;  // smaller scratch a queued job may still use
};

}  // namespace shoal
