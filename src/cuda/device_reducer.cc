#include "cuda/device_reducer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "core/log.h"
#include "reduce/reduce.h"

namespace shoal::cuda {

// The fatbin of reduce_kernels.cu (sm_90 code and compute_90 PTX), generated
// at build time (src/cuda/CMakeLists.txt); empty when nvcc was not found.
const unsigned char* reduceKernelsImage();
size_t reduceKernelsImageSize();

namespace {

#define SHOAL_CHECK_TYPE_SIZE(name, dtype, Ty) \
  static_assert(sizeof(Ty::S) == dataTypeSize(DataType::dtype), #name);
SHOAL_ELEMENT_TYPES(SHOAL_CHECK_TYPE_SIZE)
#undef SHOAL_CHECK_TYPE_SIZE
#define SHOAL_TYPE_ENUM(name, dtype, Ty) DataType::dtype,
constexpr DataType kTypesInListOrder[] = {SHOAL_ELEMENT_TYPES(SHOAL_TYPE_ENUM)};
#undef SHOAL_TYPE_ENUM
static_assert(sizeof kTypesInListOrder / sizeof kTypesInListOrder[0] == kNumDataTypes);
static_assert([] {
  for (int i = 0; i < kNumDataTypes; ++i)
    if (int(kTypesInListOrder[i]) != i) return false;
  return true;
}(), "SHOAL_ELEMENT_TYPES lists the types in DataType's order");

// Bytes per block below the full grid.
constexpr size_t kBytesPerBlock = size_t{64} << 10;
constexpr unsigned kBlocksPerMultiprocessor = 4;

bool validType(DataType t) { return int(t) >= 0 && int(t) < kNumDataTypes; }
bool validOp(ElementOp op) { return unsigned(op) < unsigned(reduce::kNumElementOps); }

}  // namespace

ReduceScalar ReduceScalar::element(DataType dtype, const void* value) {
  ReduceScalar s;
  std::memcpy(&s.bits, value, validType(dtype) ? dataTypeSize(dtype) : 0);
  return s;
}

ReduceScalar ReduceScalar::avg(DataType dtype, int nranks) {
  ReduceScalar s;
  if (!isFloating(dtype)) {
    s.bits = static_cast<uint64_t>(nranks);
    return s;
  }
  // As the host path (the API's ncclAvg lowering): 1/n formed in float, in
  // double for double, then rounded to the type.
  double scale = 1.0 / nranks;
  if (dtype != DataType::kFloat64) scale = static_cast<double>(static_cast<float>(scale));
  reduce::fromDouble(dtype, scale, &s.bits);
  return s;
}

ReduceScalar ReduceScalar::onDevice(const void* element) {
  ReduceScalar s;
  s.device = element;
  return s;
}

bool DeviceReducer::built() { return reduceKernelsImageSize() > 0; }

std::string DeviceReducer::kernelName(DataType dtype, ElementOp op) {
  if (!validType(dtype) || !validOp(op)) return "?";
  return str(reduce::kReduceKernelPrefix, reduce::kElementOpNames[int(op)], "_",
             reduce::kElementTypeNames[int(dtype)]);
}

Result<std::unique_ptr<DeviceReducer>> DeviceReducer::load(Driver& driver) {
  if (!built()) return error(Code::kUnsupported, "built without nvcc: no device reduction kernels");
  SHOAL_ASSIGN_OR_RETURN(int multiprocessors, driver.multiprocessorCount());
  SHOAL_ASSIGN_OR_RETURN(ModuleHandle module,
                         driver.loadModule(reduceKernelsImage(), "device reduction kernels"));
  std::unique_ptr<DeviceReducer> reducer(new DeviceReducer(driver, module, std::max(multiprocessors, 1)));
  // Every kernel now: none is left to load lazily during a collective.
  for (int op = 0; op < reduce::kNumElementOps; ++op) {
    for (int t = 0; t < kNumDataTypes; ++t) {
      const std::string name = kernelName(DataType(t), ElementOp(op));
      SHOAL_ASSIGN_OR_RETURN(reducer->kernels_[op][t], driver.moduleFunction(module, name.c_str()),
                             "device reduction kernels");
    }
  }
  return reducer;
}

Result<const DeviceReducer*> DeviceReducer::forCurrentContext(Driver& driver) {
  SHOAL_ASSIGN_OR_RETURN(uint64_t context, driver.currentContextInstance());
  if (context == 0) return error(Code::kInvalidUsage, "no CUDA context is current on this thread");
  // Per context instance, for the process: a module lives as long as its
  // context, and a context reset at the same handle loads them again.
  static std::mutex mutex;
  static auto* loaded = new std::map<uint64_t, Result<std::unique_ptr<DeviceReducer>>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded->find(context);
  if (it == loaded->end()) {
    it = loaded->emplace(context, load(driver)).first;
    if (it->second.isOk()) {
      SHOAL_INFO(subsys::kInit, "CUDA: device reduction kernels loaded (", reduce::kNumElementOps,
                 " operators x ", kNumDataTypes, " types, every kernel resolved), ",
                 it->second.value()->multiprocessors(), " multiprocessors");
    } else {
      SHOAL_INFO(subsys::kInit, "CUDA: no device reduction kernels: ", it->second.status().message());
    }
  }
  if (!it->second.isOk()) return it->second.status();
  return static_cast<const DeviceReducer*>(it->second.value().get());
}

DeviceReducer::~DeviceReducer() { driver_.unloadModule(module_); }

unsigned DeviceReducer::blocksFor(size_t bytes) const {
  const size_t wanted = (bytes + kBytesPerBlock - 1) / kBytesPerBlock;
  const size_t most = size_t(multiprocessors_) * kBlocksPerMultiprocessor;
  return static_cast<unsigned>(std::clamp<size_t>(wanted, 1, most));
}

Status DeviceReducer::launch(void* dst, const void* a, const void* b, size_t count, DataType dtype,
                             ElementOp op, const ReduceScalar& scalar, StreamHandle stream) const {
  if (!validType(dtype)) return invalidArgument("device reduction: unknown data type ", int(dtype));
  if (!validOp(op)) return invalidArgument("device reduction: unknown operator ", int(op));
  if (count == 0) return Status::ok();
  const char* what = reduce::kElementOpNames[int(op)];
  const char* type = reduce::kElementTypeNames[int(dtype)];
  const size_t size = dataTypeSize(dtype);
  if (dst == nullptr || a == nullptr || b == nullptr)
    return invalidArgument("device reduction ", what, " of ", count, " ", type,
                           ": a buffer is NULL (dst ", dst, ", a ", a, ", b ", b, ")");
  for (const void* p : {static_cast<const void*>(dst), a, b})
    if (reinterpret_cast<uintptr_t>(p) % size != 0)
      return invalidArgument("device reduction ", what, " of ", type, ": buffer ", p,
                             " is not aligned to the ", size, "-byte element");
  if (count > SIZE_MAX / size)
    return invalidArgument("device reduction ", what, ": ", count, " elements overflow");
  const bool integerAvg = op == ElementOp::kAvg && !isFloating(dtype);
  if (integerAvg && scalar.bits == 0)
    return invalidArgument("device reduction avg of ", type, ": the divisor is 0");
  if (scalar.device != nullptr) {
    if (op != ElementOp::kPreMulSum)
      return invalidArgument("device reduction ", what, " of ", type,
                             ": only premulsum reads its scalar from device memory");
    if (reinterpret_cast<uintptr_t>(scalar.device) % size != 0)
      return invalidArgument("device reduction premulsum of ", type, ": the scalar at ",
                             scalar.device, " is not aligned to the ", size, "-byte element");
  }
  void* dstArg = dst;
  const void* aArg = a;
  const void* bArg = b;
  unsigned long long countArg = count;
  const void* scalarArg = scalar.device;
  unsigned long long bitsArg = scalar.bits;
  void* args[] = {&dstArg, &aArg, &bArg, &countArg, &scalarArg, &bitsArg};
  return driver_.launch(kernels_[int(op)][int(dtype)], blocksFor(count * size), kThreads, args, stream);
}

}  // namespace shoal::cuda
