#include "comm/device_steps.h"

#include "transports/registry.h"

namespace shoal {

Result<std::shared_ptr<DevicePlanSteps>> DevicePlanSteps::make(cuda::Driver& driver,
                                                               const cuda::DeviceReducer& reducer, bool computes) {
  SHOAL_ASSIGN_OR_RETURN(cuda::ContextHandle context, driver.currentContext(), "device plans");
  if (context == nullptr) return invalidUsage("device plans need a current CUDA context");
  cuda::StreamHandle stream = nullptr;
  if (computes) {
    SHOAL_ASSIGN_OR_RETURN(stream, driver.createStream(), "device plans: a stream");
  }
  return std::shared_ptr<DevicePlanSteps>(new DevicePlanSteps(driver, reducer, context, stream));
}

DevicePlanSteps::~DevicePlanSteps() {
  cuda::ContextScope scope(driver_, context_);
  if (!scope.entered()) return;  // never free memory a GPU may still use
  if (stream_) (void)driver_.synchronize(stream_);
  for (auto [p, bytes] : retired_) freeScratch(p, bytes);
  if (scratch_) freeScratch(scratch_, scratchBytes_);
  if (stream_) driver_.destroyStream(stream_);
}

void DevicePlanSteps::freeScratch(uint8_t* p, uint64_t bytes) {
  forgetMemory(p, bytes);  // no transport keeps a registration of a reused address
  (void)driver_.deviceFree(p);
}

template <typename Enqueue>
Status DevicePlanSteps::runAndWait(Enqueue enqueue) {
  if (!stream_) return internalError("device plan step on scratch-only steps");
  cuda::ContextScope scope(driver_, context_);
  SHOAL_TRY(scope.status()) << "device plan step";
  SHOAL_TRY(enqueue());
  return driver_.synchronize(stream_);
}

reduce::ElementOp elementOpOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return reduce::ElementOp::kSum;
    case ReduceOp::kProd: return reduce::ElementOp::kProd;
    case ReduceOp::kMax: return reduce::ElementOp::kMax;
    case ReduceOp::kMin: return reduce::ElementOp::kMin;
    case ReduceOp::kPreMulSum: return reduce::ElementOp::kPreMulSum;
  }
  return reduce::ElementOp::kSum;
}

Status DevicePlanSteps::reduce(ReduceOp op, DataType dtype, uint8_t* dst, const uint8_t* a, const uint8_t* b,
                               uint64_t count, const void* scalar) {
  cuda::ReduceScalar s;
  if (op == ReduceOp::kPreMulSum) {
    if (scalar == nullptr) return internalError("device plan: PreMulSum without its scalar");
    s = cuda::ReduceScalar::element(dtype, scalar);
  }
  return runAndWait([&] { return reducer_.launch(dst, a, b, count, dtype, elementOpOf(op), s, stream_); });
}

Status DevicePlanSteps::copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  if (dst == src || bytes == 0) return Status::ok();
  return runAndWait([&] { return driver_.copyAsync(dst, src, bytes, stream_); });
}

Result<uint8_t*> DevicePlanSteps::scratch(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(scratchMutex_);
  if (bytes <= scratchBytes_) return scratch_;
  SHOAL_ASSIGN_OR_RETURN(void* fresh, driver_.deviceAlloc(bytes), "device plan scratch of ", bytes, " bytes");
  if (scratch_) retired_.emplace_back(scratch_, scratchBytes_);
  scratch_ = static_cast<uint8_t*>(fresh);
  scratchBytes_ = bytes;
  rememberMemory(scratch_, bytes);  // freeScratch says when it ends
  return scratch_;
}

}  // namespace shoal
