#include "cuda/driver.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/log.h"
#include "core/params.h"
#include "core/ranges.h"

#if SHOAL_HAVE_CUDA
#include <cuda.h>
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/process.h"
#include "cuda/nvml.h"
#endif

namespace shoal::cuda {

const char* memoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kPinnedHost: return "pinned host";
    case MemoryKind::kDevice: return "device";
    case MemoryKind::kManaged: return "managed";
  }
  return "?";
}

const char* waitModeName(WaitMode mode) {
  switch (mode) {
    case WaitMode::kMemOps: return "stream memory operations";
    case WaitMode::kWaitKernel: return "a wait kernel";
    case WaitMode::kSynchronous: return "synchronous";
  }
  return "?";
}

std::string DeviceIdentity::uuidText() const {
  char text[48];
  const uint8_t* u = uuid.data();
  std::snprintf(text, sizeof text,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                u[14], u[15]);
  return text;
}

#if !SHOAL_HAVE_CUDA

// Built without the toolkit: host memory only.
bool Driver::built() { return false; }
Driver* Driver::inUse() { return nullptr; }
Result<MemoryKind> Driver::memoryKind(const void*) { return MemoryKind::kHost; }
Result<Driver::Place> Driver::placeOf(const void*) { return Place{}; }
Result<std::optional<DeviceIdentity>> Driver::currentDevice() {
  return std::optional<DeviceIdentity>();
}
WaitMode Driver::waitMode(int) { return WaitMode::kSynchronous; }
void Driver::memOpsUnsupported(int) {}
Result<bool> Driver::isCapturing(StreamHandle) { return false; }
bool Driver::capturesGraphs() const { return false; }
Result<GraphHandle> Driver::captureGraph(StreamHandle) { return GraphHandle(nullptr); }
Status Driver::launchHostFunction(StreamHandle, void (*)(void*), void*) {
  return error(Code::kCudaError, "built without CUDA");
}
Status Driver::tieToGraph(GraphHandle, void* object, void (*destroy)(void*)) {
  destroy(object);
  return error(Code::kCudaError, "built without CUDA");
}
int Driver::exchangeCaptureMode(int mode) { return mode; }
static Status notBuilt() { return error(Code::kCudaError, "built without CUDA"); }
Result<ContextHandle> Driver::streamContext(StreamHandle) { return notBuilt(); }
Status Driver::copyAsync(void*, const void*, size_t, StreamHandle) { return notBuilt(); }
Status Driver::copy(void*, const void*, size_t) { return notBuilt(); }
Status Driver::writeValueAsync(uint64_t*, uint64_t, StreamHandle) { return notBuilt(); }
Status Driver::writeValuesAsync(uint64_t*, std::span<const WordWrite>, StreamHandle) { return notBuilt(); }
Status Driver::waitValueAsync(const uint64_t*, uint64_t, StreamHandle) { return notBuilt(); }
Status Driver::waitValueEqualAsync(const uint64_t*, uint64_t, StreamHandle) { return notBuilt(); }
Status Driver::launchWait(const uint64_t*, uint64_t, StreamHandle) { return notBuilt(); }
Status Driver::synchronize(StreamHandle) { return notBuilt(); }
Result<ContextHandle> Driver::currentContext() { return notBuilt(); }
Result<uint64_t> Driver::currentContextInstance() { return notBuilt(); }
bool Driver::contextStillThere(ContextHandle, uint64_t) { return false; }
Result<int> Driver::multiprocessorCount() { return notBuilt(); }
Result<ModuleHandle> Driver::loadModule(const void*, const char*) { return notBuilt(); }
Result<FunctionHandle> Driver::moduleFunction(ModuleHandle, const char*) { return notBuilt(); }
void Driver::unloadModule(ModuleHandle) {}
Status Driver::launch(FunctionHandle, unsigned, unsigned, void**, StreamHandle) { return notBuilt(); }
Result<EventHandle> Driver::createEvent() { return notBuilt(); }
void Driver::destroyEvent(EventHandle) {}
Status Driver::recordEvent(EventHandle, StreamHandle) { return notBuilt(); }
Status Driver::streamWaitEvent(StreamHandle, EventHandle) { return notBuilt(); }
Result<void*> Driver::hostAlloc(size_t) { return notBuilt(); }
void Driver::hostFree(void*) {}
Status Driver::registerHost(void*, size_t) { return notBuilt(); }
void Driver::unregisterHost(void*) {}
WaitMode Driver::waitModeOf(const std::string&) { return WaitMode::kSynchronous; }
bool Driver::streamPlansWanted(const std::string&) { return false; }
bool Driver::fewHardwareQueues() { return false; }
Result<void*> Driver::deviceAlloc(size_t) { return notBuilt(); }
bool Driver::deviceFree(void*) { return false; }
std::optional<Driver::DeviceAllocation> Driver::deviceAllocationOf(const void*, size_t) { return std::nullopt; }
bool Driver::reachableFrom(const void*, size_t, const std::string&) { return false; }
Result<ContextHandle> Driver::primaryContext(const std::string&) { return notBuilt(); }
Result<ContextHandle> Driver::primaryContextOfDevice(int) { return notBuilt(); }
bool Driver::gpusShareMemory(const std::string&, const std::string&) { return false; }
Status Driver::pushContext(ContextHandle) { return notBuilt(); }
void Driver::popContext() {}
Result<StreamHandle> Driver::createStream() { return notBuilt(); }
void Driver::destroyStream(StreamHandle) {}
Result<bool> Driver::eventDone(EventHandle) { return notBuilt(); }
Result<Driver::Exported> Driver::exportDeviceMemory(void*) { return notBuilt(); }
Result<void*> Driver::importDeviceMemory(int, size_t) { return notBuilt(); }

#else

// The driver API version whose signatures Shoal was written against: every
// entry point is asked for as it was in CUDA 12.0 (the _v2 stream memory
// operations and cuGetProcAddress_v2 exist from there on), but those that
// came later, asked for as of the version that brought them.
constexpr int kApiVersion = 12000;

#define SHOAL_CUDA_ENTRY_POINTS(X)                                                       \
  X(cuInit) X(cuGetErrorString) X(cuGetErrorName) X(cuCtxGetCurrent) X(cuCtxGetDevice)   \
  X(cuDeviceGetUuid) X(cuDeviceGetAttribute) X(cuPointerGetAttributes)                   \
  X(cuStreamIsCapturing) X(cuMemcpyAsync) X(cuMemcpy) X(cuStreamWriteValue64)            \
  X(cuStreamWaitValue64) X(cuStreamSynchronize) X(cuEventCreate) X(cuEventDestroy)       \
  X(cuEventRecord) X(cuStreamWaitEvent) X(cuMemHostAlloc) X(cuMemFreeHost)               \
  X(cuMemHostGetDevicePointer) X(cuMemGetAllocationGranularity) X(cuMemCreate)           \
  X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap)   \
  X(cuMemSetAccess) X(cuModuleLoadData) X(cuModuleGetFunction) X(cuLaunchKernel)         \
  X(cuModuleUnload) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain)          \
  X(cuDevicePrimaryCtxGetState)                                                         \
  X(cuDeviceCanAccessPeer) X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuStreamCreate)      \
  X(cuStreamDestroy) X(cuEventQuery) X(cuMemExportToShareableHandle)                     \
  X(cuMemImportFromShareableHandle) X(cuMemHostRegister) X(cuMemHostUnregister)       \
  X(cuStreamGetCtx)
// Entry points used when present, each with the CUDA version that brought
// it: asked for as of an older one, the driver gives none
// (CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT).
#define SHOAL_CUDA_OPTIONAL_ENTRY_POINTS(X) X(cuFuncLoad, 12040) X(cuStreamBatchMemOp, kApiVersion) X(cuCtxGetId, kApiVersion)
// What graph capture uses, asked for as in CUDA 12.3 (cuStreamGetCaptureInfo's
// signature with edge data; the others are unchanged since 11.x; a driver
// older than 12.3 answers with its _v2, whose first six parameters are the
// same, and the seventh, null here, goes unread). Capture is refused where
// any is missing.
constexpr int kGraphApiVersion = 12030;
#define SHOAL_CUDA_GRAPH_ENTRY_POINTS(X)                                                   \
  X(cuLaunchHostFunc) X(cuUserObjectCreate) X(cuUserObjectRelease) X(cuGraphRetainUserObject) \
  X(cuThreadExchangeStreamCaptureMode)

// cuStreamGetCaptureInfo as CUDA 12.3 defines it (_v3: with edge data),
// spelled out: cuda.h of 12.0-12.2 has no _v3, and 12.x's maps the plain
// name to _v2.
using StreamGetCaptureInfoV3 = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                            const CUgraphNode**, const void**, size_t*);

struct Driver::Api {
#define SHOAL_CUDA_FIELD(name) decltype(&::name) name = nullptr;
#define SHOAL_CUDA_OPTIONAL_FIELD(name, since) decltype(&::name) name = nullptr;
  SHOAL_CUDA_ENTRY_POINTS(SHOAL_CUDA_FIELD)
  SHOAL_CUDA_OPTIONAL_ENTRY_POINTS(SHOAL_CUDA_OPTIONAL_FIELD)
#undef SHOAL_CUDA_OPTIONAL_FIELD
#undef SHOAL_CUDA_FIELD
#define SHOAL_CUDA_GRAPH_FIELD(name) decltype(&::name) name = nullptr;
  SHOAL_CUDA_GRAPH_ENTRY_POINTS(SHOAL_CUDA_GRAPH_FIELD)
#undef SHOAL_CUDA_GRAPH_FIELD
  StreamGetCaptureInfoV3 cuStreamGetCaptureInfo = nullptr;
  bool graphs = false;  // every graph entry point resolved

  std::atomic<bool> batchesRefused{false};  // cuStreamBatchMemOp said CUDA_ERROR_NOT_SUPPORTED once
  // The device whose primary context answers pointer queries on threads
  // without a context (queryPointer), -1 until one did: retained for the
  // process (primaryContexts), so it stays active and is not looked for again.
  std::atomic<int> answeringDevice{-1};
  std::mutex mutex;  // guards the maps below
  std::map<int, WaitMode> waitModes;
  std::map<uint64_t, CUfunction> waitKernels;   // loaded per context instance
  std::map<int, CUcontext> primaryContexts;     // retained by primaryContext(), per device
  struct DeviceAllocation {
    size_t bytes;
    CUmemGenericAllocationHandle handle;
    uint64_t serial;
    uint64_t reachableFrom;  // bit d: device ordinal d may access it (cuMemSetAccess)
  };
  std::map<uintptr_t, DeviceAllocation> deviceAllocations;
  uint64_t lastSerial = 0;
};

extern const char kWaitKernelPtx[];  // wait_kernel.cu as PTX; empty without nvcc

namespace {

// "cuMemcpyAsync failed: CUDA_ERROR_INVALID_VALUE (invalid argument)".
Status cudaError(Driver::Api& api, const char* what, CUresult rc) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName) (void)api.cuGetErrorName(rc, &name);
  if (api.cuGetErrorString) (void)api.cuGetErrorString(rc, &text);
  return error(Code::kCudaError, what, " failed: ", name ? name : "CUDA error ",
               name ? "" : std::to_string(static_cast<int>(rc)), text ? " (" : "", text ? text : "",
               text ? ")" : "");
}

#define SHOAL_CU(call)                                              \
  do {                                                              \
    CUresult shoal_rc_ = api_->call;                                \
    if (shoal_rc_ != CUDA_SUCCESS) return cudaError(*api_, #call, shoal_rc_); \
  } while (0)

// Loads the entry points from a driver library the process already has.
// Null (with the reason at INFO) when it has none or it is unusable;
// `present` says whether it had one.
Driver::Api* loadApi(bool& present) {
  const std::string& path = params().cudaDriver;
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  present = lib != nullptr;
  if (lib == nullptr) return nullptr;  // the process does not use CUDA (yet)
  using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);
  auto getProc = reinterpret_cast<GetProcAddress>(::dlsym(lib, "cuGetProcAddress_v2"));
  if (getProc == nullptr) {
    SHOAL_INFO(subsys::kInit, "CUDA: ", path, " has no cuGetProcAddress_v2 (driver older than 12.0): host memory only");
    return nullptr;
  }
  auto api = std::make_unique<Driver::Api>();
  bool complete = true;
#define SHOAL_CUDA_RESOLVE(name)                                                        \
  {                                                                                      \
    void* fn = nullptr;                                                                  \
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;         \
    if (getProc(#name, &fn, kApiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS || \
        fn == nullptr) {                                                                 \
      SHOAL_INFO(subsys::kInit, "CUDA: ", path, " lacks ", #name);                       \
      complete = false;                                                                  \
    }                                                                                    \
    api->name = reinterpret_cast<decltype(api->name)>(fn);                               \
  }
  SHOAL_CUDA_ENTRY_POINTS(SHOAL_CUDA_RESOLVE)
#undef SHOAL_CUDA_RESOLVE
#define SHOAL_CUDA_RESOLVE_OPTIONAL(name, since)                                         \
  {                                                                                      \
    void* fn = nullptr;                                                                  \
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;         \
    if (getProc(#name, &fn, since, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS) \
      fn = nullptr;                                                                      \
    api->name = reinterpret_cast<decltype(api->name)>(fn);                               \
  }
  SHOAL_CUDA_OPTIONAL_ENTRY_POINTS(SHOAL_CUDA_RESOLVE_OPTIONAL)
#undef SHOAL_CUDA_RESOLVE_OPTIONAL
  api->graphs = true;
#define SHOAL_CUDA_RESOLVE_GRAPH(name)                                                   \
  {                                                                                      \
    void* fn = nullptr;                                                                  \
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;         \
    if (getProc(#name, &fn, kGraphApiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS || \
        fn == nullptr) {                                                                 \
      SHOAL_INFO(subsys::kInit, "CUDA: ", path, " lacks ", #name, " (as in CUDA 12.3): collectives cannot be " \
                 "captured into CUDA graphs");                                           \
      api->graphs = false;                                                               \
      fn = nullptr;                                                                      \
    }                                                                                    \
    api->name = reinterpret_cast<decltype(api->name)>(fn);                               \
  }
  SHOAL_CUDA_GRAPH_ENTRY_POINTS(SHOAL_CUDA_RESOLVE_GRAPH)
  SHOAL_CUDA_RESOLVE_GRAPH(cuStreamGetCaptureInfo)
#undef SHOAL_CUDA_RESOLVE_GRAPH
  if (!complete) {
    SHOAL_WARN("CUDA: the driver ", path, " lacks entry points Shoal needs: host memory only");
    return nullptr;
  }
  CUresult rc = api->cuInit(0);
  if (rc != CUDA_SUCCESS) {
    SHOAL_INFO(subsys::kInit, "CUDA: cuInit failed (", static_cast<int>(rc), "): host memory only");
    return nullptr;
  }
  SHOAL_INFO(subsys::kInit, "CUDA: using the driver API of ", path);
  return api.release();  // lives for the process, as the library does
}

}  // namespace

bool Driver::built() { return true; }

Driver* Driver::inUse() {
  static std::atomic<Driver*> found{nullptr};
  static std::atomic<bool> unusable{false};  // loaded, and refused once: not asked again
  static std::mutex loadMutex;
  if (Driver* d = found.load(std::memory_order_acquire)) return d;
  if (unusable.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard<std::mutex> lock(loadMutex);
  if (Driver* d = found.load(std::memory_order_relaxed)) return d;
  if (unusable.load(std::memory_order_relaxed)) return nullptr;
  bool present = false;
  Api* api = loadApi(present);
  if (api == nullptr) {
    if (present) unusable.store(true, std::memory_order_release);
    return nullptr;
  }
  auto* driver = new Driver(api);
  found.store(driver, std::memory_order_release);
  return driver;
}

// Pointer queries need a context current on the calling thread: the driver
// answers CUDA_ERROR_INVALID_CONTEXT without one (the engine's thread, a
// group's set-up threads, a caller that never made one current). Addressing
// is unified, so any context of the process answers for every pointer: the
// query is asked again with an active primary context current (retained
// once, as primaryContextOfDevice, and then remembered: Api::answeringDevice).
// A process where none is active holds no CUDA memory that Shoal could be
// handed (device and pinned memory live in a context; one made with
// cuCtxCreate and never current here is not seen): `none` is its answer then.
static Result<bool> queryPointer(Driver& driver, Driver::Api& api, const void* ptr, unsigned count,
                                 CUpointer_attribute* attrs, void** data) {
  const auto at = reinterpret_cast<CUdeviceptr>(ptr);
  CUresult rc = api.cuPointerGetAttributes(count, attrs, data, at);
  if (rc == CUDA_SUCCESS) return true;
  if (rc != CUDA_ERROR_INVALID_CONTEXT) return cudaError(api, "cuPointerGetAttributes", rc);
  int answering = api.answeringDevice.load(std::memory_order_acquire);
  if (answering < 0) {
    int devices = 0;
    if (CUresult c = api.cuDeviceGetCount(&devices); c != CUDA_SUCCESS)
      return cudaError(api, "cuDeviceGetCount", c);
    for (int ordinal = 0; ordinal < devices && answering < 0; ++ordinal) {
      unsigned flags = 0;
      int active = 0;
      if (api.cuDevicePrimaryCtxGetState(static_cast<CUdevice>(ordinal), &flags, &active) == CUDA_SUCCESS &&
          active)
        answering = ordinal;
    }
    if (answering < 0) return false;
  }
  SHOAL_ASSIGN_OR_RETURN(ContextHandle context, driver.primaryContextOfDevice(answering));
  api.answeringDevice.store(answering, std::memory_order_release);  // retained now: it stays active
  ContextScope scope(driver, context);
  SHOAL_TRY(scope.status());
  rc = api.cuPointerGetAttributes(count, attrs, data, at);
  if (rc != CUDA_SUCCESS) return cudaError(api, "cuPointerGetAttributes", rc);
  return true;
}

Result<MemoryKind> Driver::memoryKind(const void* ptr) {
  SHOAL_ASSIGN_OR_RETURN(Place place, placeOf(ptr));
  return place.kind;
}

Result<Driver::Place> Driver::placeOf(const void* ptr) {
  Place place;
  if (ptr == nullptr) return place;
  unsigned int type = 0;
  int managed = 0;  // CU_POINTER_ATTRIBUTE_IS_MANAGED is a bool: read into a zeroed int
  int ordinal = -1;
  CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void* data[3] = {&type, &managed, &ordinal};
  SHOAL_ASSIGN_OR_RETURN(bool answered, queryPointer(*this, *api_, ptr, 3, attrs, data));
  if (!answered) return place;
  if (managed & 0xff) {
    place.kind = MemoryKind::kManaged;
  } else {
    switch (type) {
      case CU_MEMORYTYPE_DEVICE:
      case CU_MEMORYTYPE_ARRAY: place.kind = MemoryKind::kDevice; break;
      case CU_MEMORYTYPE_HOST: place.kind = MemoryKind::kPinnedHost; return place;
      case 0: return place;
      default:
        return error(Code::kCudaError, "cuPointerGetAttributes: unknown memory type ", type, " for ", ptr);
    }
  }
  if (ordinal < 0 && place.kind == MemoryKind::kDevice)
    return error(Code::kCudaError, "cuPointerGetAttributes: no device holds the device memory at ", ptr);
  place.device = ordinal < 0 ? -1 : ordinal;
  return place;
}

Result<std::optional<DeviceIdentity>> Driver::currentDevice() {
  CUcontext ctx = nullptr;
  SHOAL_CU(cuCtxGetCurrent(&ctx));
  if (ctx == nullptr) return std::optional<DeviceIdentity>();
  CUdevice dev = 0;
  SHOAL_CU(cuCtxGetDevice(&dev));
  DeviceIdentity id;
  id.ordinal = static_cast<int>(dev);
  CUuuid uuid{};
  SHOAL_CU(cuDeviceGetUuid(&uuid, dev));
  static_assert(sizeof uuid.bytes == 16);
  for (int i = 0; i < 16; ++i) id.uuid[i] = static_cast<uint8_t>(uuid.bytes[i]);
  return std::optional<DeviceIdentity>(id);
}

// The id of the current context's instance (Driver::currentContextInstance).
static Result<uint64_t> contextInstance(Driver::Api& api) {
  CUcontext ctx = nullptr;
  CUresult rc = api.cuCtxGetCurrent(&ctx);
  if (rc != CUDA_SUCCESS) return cudaError(api, "cuCtxGetCurrent", rc);
  if (ctx == nullptr) return uint64_t{0};
  if (api.cuCtxGetId == nullptr) return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ctx));
  unsigned long long id = 0;
  rc = api.cuCtxGetId(ctx, &id);
  if (rc != CUDA_SUCCESS) return cudaError(api, "cuCtxGetId", rc);
  return static_cast<uint64_t>(id);
}

// The wait kernel of the calling thread's context, loaded on first use.
// Caller holds api.mutex.
static Result<CUfunction> waitKernelLocked(Driver::Api& api) {
  SHOAL_ASSIGN_OR_RETURN(uint64_t ctx, contextInstance(api));
  if (ctx == 0) return error(Code::kInvalidUsage, "no CUDA context is current");
  auto it = api.waitKernels.find(ctx);
  if (it != api.waitKernels.end()) return it->second;
  if (kWaitKernelPtx[0] == '\0') return error(Code::kUnsupported, "built without nvcc: no wait kernel");
  CUmodule module = nullptr;
  CUresult rc = api.cuModuleLoadData(&module, kWaitKernelPtx);
  if (rc != CUDA_SUCCESS) return cudaError(api, "cuModuleLoadData (wait kernel)", rc);
  CUfunction fn = nullptr;
  rc = api.cuModuleGetFunction(&fn, module, "shoal_wait_u64");
  if (rc != CUDA_SUCCESS) return cudaError(api, "cuModuleGetFunction (shoal_wait_u64)", rc);
  api.waitKernels[ctx] = fn;  // the module lives as long as the context
  return fn;
}

// The first of the modes, from `from` down, that the device supports.
static WaitMode chooseWaitMode(Driver::Api& api, int device, WaitMode from, std::string& why) {
  if (from == WaitMode::kMemOps) {
    int memOps = 0;
    CUresult rc = api.cuDeviceGetAttribute(
        &memOps, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, static_cast<CUdevice>(device));
    if (rc == CUDA_SUCCESS && memOps) {
      why = "the device has 64-bit stream memory operations";
      return WaitMode::kMemOps;
    }
    why = "the device has no 64-bit stream memory operations";
  }
  if (from != WaitMode::kSynchronous) {
    Result<CUfunction> kernel = waitKernelLocked(api);
    if (kernel.isOk()) {
      why += str(why.empty() ? "" : ", ", "the wait kernel loaded");
      return WaitMode::kWaitKernel;
    }
    why += str(why.empty() ? "" : "; ", "no wait kernel: ", kernel.status().message());
  }
  return WaitMode::kSynchronous;
}

WaitMode Driver::waitMode(int device) {
  std::lock_guard<std::mutex> lock(api_->mutex);
  auto it = api_->waitModes.find(device);
  if (it != api_->waitModes.end()) return it->second;
  const std::string& want = params().cudaWait;
  WaitMode from = WaitMode::kMemOps;
  std::string why;
  if (want == "sync") {
    from = WaitMode::kSynchronous;
    why = "SHOAL_CUDA_WAIT=sync";
  } else if (want == "kernel") {
    from = WaitMode::kWaitKernel;
    why = "SHOAL_CUDA_WAIT=kernel";
  } else if (want != "auto" && want != "memops") {
    SHOAL_WARN("CUDA: SHOAL_CUDA_WAIT=", want, " is not auto, memops, kernel or sync: auto");
  }
  WaitMode mode = chooseWaitMode(*api_, device, from, why);
  if ((want == "memops" && mode != WaitMode::kMemOps) || (want == "kernel" && mode != WaitMode::kWaitKernel))
    SHOAL_WARN("CUDA: SHOAL_CUDA_WAIT=", want, " cannot be honoured on device ", device, ": ", why);
  api_->waitModes[device] = mode;
  SHOAL_INFO(subsys::kInit, "CUDA: device ", device, ": streams hand operations to Shoal by ",
             waitModeName(mode), " (", why, ")");
  return mode;
}

void Driver::memOpsUnsupported(int device) {
  std::lock_guard<std::mutex> lock(api_->mutex);
  std::string why = "a stream memory operation was refused as unsupported";
  WaitMode mode = chooseWaitMode(*api_, device, WaitMode::kWaitKernel, why);
  api_->waitModes[device] = mode;
  SHOAL_INFO(subsys::kInit, "CUDA: device ", device, ": ", why, ": ", waitModeName(mode),
             " from now on");
}

Status Driver::launchWait(const uint64_t* word, uint64_t value, StreamHandle stream) {
  CUfunction fn = nullptr;
  {
    std::lock_guard<std::mutex> lock(api_->mutex);
    SHOAL_ASSIGN_OR_RETURN(fn, waitKernelLocked(*api_));
  }
  CUdeviceptr at = 0;
  SHOAL_CU(cuMemHostGetDevicePointer(&at, const_cast<uint64_t*>(word), 0));
  unsigned long long target = value;
  CUdeviceptr noAbort = 0;  // the engine releases the word itself on abort
  void* args[] = {&at, &target, &noAbort};
  SHOAL_CU(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, static_cast<CUstream>(stream), args, nullptr));
  return Status::ok();
}

Result<bool> Driver::isCapturing(StreamHandle stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  SHOAL_CU(cuStreamIsCapturing(static_cast<CUstream>(stream), &status));
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

bool Driver::capturesGraphs() const { return api_->graphs; }

Result<GraphHandle> Driver::captureGraph(StreamHandle stream) {
  if (!api_->graphs) return error(Code::kUnsupported, "the CUDA driver cannot capture graphs");
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph graph = nullptr;
  SHOAL_CU(cuStreamGetCaptureInfo(static_cast<CUstream>(stream), &status, nullptr, &graph, nullptr, nullptr,
                                  nullptr));
  if (status == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    return error(Code::kCudaError, "the stream's capture was invalidated by an earlier CUDA call");
  return static_cast<GraphHandle>(status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? graph : nullptr);
}

Status Driver::launchHostFunction(StreamHandle stream, void (*fn)(void*), void* arg) {
  if (!api_->graphs) return error(Code::kUnsupported, "the CUDA driver has no host functions");
  SHOAL_CU(cuLaunchHostFunc(static_cast<CUstream>(stream), fn, arg));
  return Status::ok();
}

Status Driver::tieToGraph(GraphHandle graph, void* object, void (*destroy)(void*)) {
  if (!api_->graphs) {
    destroy(object);
    return error(Code::kUnsupported, "the CUDA driver has no user objects");
  }
  CUuserObject user = nullptr;
  if (CUresult rc = api_->cuUserObjectCreate(&user, object, destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
      rc != CUDA_SUCCESS) {
    destroy(object);
    return cudaError(*api_, "cuUserObjectCreate", rc);
  }
  if (CUresult rc = api_->cuGraphRetainUserObject(static_cast<CUgraph>(graph), user, 1, CU_GRAPH_USER_OBJECT_MOVE);
      rc != CUDA_SUCCESS) {
    (void)api_->cuUserObjectRelease(user, 1);  // the last reference: destroy runs
    return cudaError(*api_, "cuGraphRetainUserObject", rc);
  }
  return Status::ok();
}

int Driver::exchangeCaptureMode(int mode) {
  if (!api_->graphs) return mode;
  auto m = static_cast<CUstreamCaptureMode>(mode);
  if (api_->cuThreadExchangeStreamCaptureMode(&m) != CUDA_SUCCESS) return mode;
  return static_cast<int>(m);
}

Result<ContextHandle> Driver::streamContext(StreamHandle stream) {
  CUcontext ctx = nullptr;
  SHOAL_CU(cuStreamGetCtx(static_cast<CUstream>(stream), &ctx));
  return static_cast<ContextHandle>(ctx);
}

Status Driver::copyAsync(void* dst, const void* src, size_t bytes, StreamHandle stream) {
  if (bytes == 0) return Status::ok();
  SHOAL_CU(cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src),
                         bytes, static_cast<CUstream>(stream)));
  return Status::ok();
}

Status Driver::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::ok();
  SHOAL_CU(cuMemcpy(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), bytes));
  return Status::ok();
}

namespace {
// One word written by the stream at device address `at`.
Status writeWord(Driver::Api& api, CUdeviceptr at, uint64_t value, StreamHandle stream) {
  CUresult rc = api.cuStreamWriteValue64(static_cast<CUstream>(stream), at, value, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (rc == CUDA_ERROR_NOT_SUPPORTED) return error(Code::kUnsupported, "cuStreamWriteValue64 is not supported");
  if (rc != CUDA_SUCCESS) return cudaError(api, "cuStreamWriteValue64", rc);
  return Status::ok();
}
}  // namespace

Status Driver::writeValueAsync(uint64_t* word, uint64_t value, StreamHandle stream) {
  CUdeviceptr at = 0;
  SHOAL_CU(cuMemHostGetDevicePointer(&at, word, 0));
  return writeWord(*api_, at, value, stream);
}

Status Driver::writeValuesAsync(uint64_t* base, std::span<const WordWrite> writes, StreamHandle stream) {
  if (writes.empty()) return Status::ok();
  if (writes.size() > kMaxBatchedWrites)
    return internalError("writeValuesAsync: ", writes.size(), " writes, at most ", kMaxBatchedWrites);
  CUdeviceptr at = 0;  // one registration: its words are contiguous on the device side too
  SHOAL_CU(cuMemHostGetDevicePointer(&at, base, 0));
  if (api_->cuStreamBatchMemOp != nullptr && !api_->batchesRefused.load(std::memory_order_relaxed)) {
    constexpr size_t kInline = 16;  // a board message is 8
    std::array<CUstreamBatchMemOpParams, kInline> inlineOps{};
    std::vector<CUstreamBatchMemOpParams> moreOps(writes.size() > kInline ? writes.size() : 0);
    CUstreamBatchMemOpParams* ops = writes.size() > kInline ? moreOps.data() : inlineOps.data();
    for (size_t i = 0; i < writes.size(); ++i) {
      ops[i].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
      ops[i].writeValue.address = at + writes[i].offset * sizeof(uint64_t);
      ops[i].writeValue.value64 = writes[i].value;
      ops[i].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
    }
    CUresult rc = api_->cuStreamBatchMemOp(static_cast<CUstream>(stream), static_cast<unsigned>(writes.size()), ops, 0);
    if (rc == CUDA_SUCCESS) return Status::ok();
    if (rc != CUDA_ERROR_NOT_SUPPORTED) return cudaError(*api_, "cuStreamBatchMemOp", rc);
    // Refused (a platform without batches): one by one below, from now on.
    api_->batchesRefused.store(true, std::memory_order_relaxed);
  }
  for (const WordWrite& w : writes)
    SHOAL_TRY(writeWord(*api_, at + w.offset * sizeof(uint64_t), w.value, stream));
  return Status::ok();
}

namespace {
Status waitValue(Driver::Api& api, const uint64_t* word, uint64_t value, unsigned flags, StreamHandle stream);
}  // namespace

Status Driver::waitValueAsync(const uint64_t* word, uint64_t value, StreamHandle stream) {
  return waitValue(*api_, word, value, CU_STREAM_WAIT_VALUE_GEQ, stream);
}

Status Driver::waitValueEqualAsync(const uint64_t* word, uint64_t value, StreamHandle stream) {
  return waitValue(*api_, word, value, CU_STREAM_WAIT_VALUE_EQ, stream);
}

namespace {
Status waitValue(Driver::Api& api, const uint64_t* word, uint64_t value, unsigned flags, StreamHandle stream) {
  CUdeviceptr at = 0;
  CUresult rc = api.cuMemHostGetDevicePointer(&at, const_cast<uint64_t*>(word), 0);
  if (rc != CUDA_SUCCESS) return cudaError(api, "cuMemHostGetDevicePointer", rc);
  rc = api.cuStreamWaitValue64(static_cast<CUstream>(stream), at, value, flags);
  if (rc == CUDA_ERROR_NOT_SUPPORTED) return error(Code::kUnsupported, "cuStreamWaitValue64 is not supported");
  if (rc != CUDA_SUCCESS) return cudaError(api, "cuStreamWaitValue64", rc);
  return Status::ok();
}
}  // namespace

Status Driver::synchronize(StreamHandle stream) {
  SHOAL_CU(cuStreamSynchronize(static_cast<CUstream>(stream)));
  return Status::ok();
}

Result<ContextHandle> Driver::currentContext() {
  CUcontext ctx = nullptr;
  SHOAL_CU(cuCtxGetCurrent(&ctx));
  return static_cast<ContextHandle>(ctx);
}

Result<uint64_t> Driver::currentContextInstance() { return contextInstance(*api_); }

bool Driver::contextStillThere(ContextHandle context, uint64_t instance) {
  if (api_->cuCtxGetId == nullptr) return true;
  unsigned long long id = 0;
  return api_->cuCtxGetId(static_cast<CUcontext>(context), &id) == CUDA_SUCCESS && id == instance;
}

Result<int> Driver::multiprocessorCount() {
  CUdevice dev = 0;
  SHOAL_CU(cuCtxGetDevice(&dev));
  int count = 0;
  SHOAL_CU(cuDeviceGetAttribute(&count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  return count;
}

Result<ModuleHandle> Driver::loadModule(const void* image, const char* what) {
  CUmodule module = nullptr;
  CUresult rc = api_->cuModuleLoadData(&module, image);
  if (rc != CUDA_SUCCESS) return cudaError(*api_, str("cuModuleLoadData (", what, ")").c_str(), rc);
  return static_cast<ModuleHandle>(module);
}

Result<FunctionHandle> Driver::moduleFunction(ModuleHandle module, const char* name) {
  CUfunction fn = nullptr;
  CUresult rc = api_->cuModuleGetFunction(&fn, static_cast<CUmodule>(module), name);
  if (rc == CUDA_ERROR_NOT_FOUND)
    return error(Code::kInternalError, "the kernel ", name, " is not in the module");
  if (rc != CUDA_SUCCESS) return cudaError(*api_, str("cuModuleGetFunction (", name, ")").c_str(), rc);
  if (api_->cuFuncLoad != nullptr) {
    rc = api_->cuFuncLoad(fn);
    if (rc != CUDA_SUCCESS) return cudaError(*api_, str("cuFuncLoad (", name, ")").c_str(), rc);
  }
  return static_cast<FunctionHandle>(fn);
}

void Driver::unloadModule(ModuleHandle module) {
  if (module) (void)api_->cuModuleUnload(static_cast<CUmodule>(module));
}

Status Driver::launch(FunctionHandle kernel, unsigned blocks, unsigned threads, void** args,
                      StreamHandle stream) {
  SHOAL_CU(cuLaunchKernel(static_cast<CUfunction>(kernel), blocks, 1, 1, threads, 1, 1, 0,
                          static_cast<CUstream>(stream), args, nullptr));
  return Status::ok();
}

Result<EventHandle> Driver::createEvent() {
  CUevent event = nullptr;
  SHOAL_CU(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
  return static_cast<EventHandle>(event);
}

void Driver::destroyEvent(EventHandle event) {
  if (event) (void)api_->cuEventDestroy(static_cast<CUevent>(event));
}

Status Driver::recordEvent(EventHandle event, StreamHandle stream) {
  SHOAL_CU(cuEventRecord(static_cast<CUevent>(event), static_cast<CUstream>(stream)));
  return Status::ok();
}

Status Driver::streamWaitEvent(StreamHandle stream, EventHandle event) {
  SHOAL_CU(cuStreamWaitEvent(static_cast<CUstream>(stream), static_cast<CUevent>(event), 0));
  return Status::ok();
}

Result<void*> Driver::hostAlloc(size_t bytes) {
  void* ptr = nullptr;
  // DEVICEMAP: stream memory operations take its device pointer
  // (cuMemHostGetDevicePointer, which documents failing without the flag).
  SHOAL_CU(cuMemHostAlloc(&ptr, bytes == 0 ? 1 : bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  return ptr;
}

void Driver::hostFree(void* ptr) {
  if (ptr) (void)api_->cuMemFreeHost(ptr);
}

static Result<int> ordinalOf(Driver::Api& api, const std::string& gpu);

Status Driver::registerHost(void* ptr, size_t bytes) {
  SHOAL_CU(cuMemHostRegister(ptr, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
  return Status::ok();
}

void Driver::unregisterHost(void* ptr) {
  if (ptr) (void)api_->cuMemHostUnregister(ptr);
}

bool Driver::streamPlansWanted(const std::string& gpu) {
  if (waitModeOf(gpu) != WaitMode::kMemOps) return false;
  const std::string& want = params().cudaStreamPlans;
  if (want == "0") return false;
  if (want == "1") return true;
  static std::once_flag toldValue, toldQueues;
  if (want != "auto")
    std::call_once(toldValue, [&] { SHOAL_WARN("SHOAL_CUDA_STREAM_PLANS=", want, " is not auto, 1 or 0: auto"); });
  if (fewHardwareQueues()) {
    std::call_once(toldQueues, [&] {
      SHOAL_INFO(subsys::kInit | subsys::kNet, "no stream plans: CUDA_DEVICE_MAX_CONNECTIONS=",
                 std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"),
                 " leaves too few hardware queues for a stream per lane (SHOAL_CUDA_STREAM_PLANS=1 overrides)");
    });
    return false;
  }
  return true;
}

bool Driver::fewHardwareQueues() {
  const char* queues = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  return queues != nullptr && std::atoi(queues) > 0 && std::atoi(queues) < 4;
}

WaitMode Driver::waitModeOf(const std::string& gpu) {
  Result<int> ordinal = ordinalOf(*api_, gpu);
  if (!ordinal.isOk() || ordinal.value() < 0) return WaitMode::kSynchronous;
  return waitMode(ordinal.value());
}

static uint64_t deviceBit(int ordinal) { return ordinal >= 0 && ordinal < 64 ? uint64_t{1} << ordinal : 0; }

// Maps `handle` (size bytes) at a new address, read-write for `location`'s
// device, and records it for deviceFree; on failure releases the handle.
static Result<void*> mapAllocation(Driver::Api& api, CUmemGenericAllocationHandle handle, size_t size,
                                   size_t granularity, const CUmemLocation& location, const char* what) {
  CUdeviceptr at = 0;
  CUresult rc = api.cuMemAddressReserve(&at, size, granularity, 0, 0);
  if (rc == CUDA_SUCCESS) {
    rc = api.cuMemMap(at, size, 0, handle, 0);
    if (rc == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location = location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      rc = api.cuMemSetAccess(at, size, &access, 1);
      if (rc != CUDA_SUCCESS) (void)api.cuMemUnmap(at, size);
    }
    if (rc != CUDA_SUCCESS) (void)api.cuMemAddressFree(at, size);
  }
  if (rc != CUDA_SUCCESS) {
    (void)api.cuMemRelease(handle);
    return cudaError(api, what, rc);
  }
  std::lock_guard<std::mutex> lock(api.mutex);
  api.deviceAllocations[static_cast<uintptr_t>(at)] = {size, handle, ++api.lastSerial, deviceBit(location.id)};
  return reinterpret_cast<void*>(at);
}

// A cuMem mapping is reachable only from the devices it was granted to:
// every other device of this process with peer access to `owner` gets
// read-write access too (as NCCL's ncclMemAlloc does), so ranks on another
// GPU of the process can copy from it and read it in kernels. A refusal is
// a warning (NCCL fails the allocation): windows do not map it there, and
// that device's copies from it fail with the driver's error.
// Returns the devices granted (deviceBit).
static uint64_t grantPeerAccess(Driver::Api& api, CUdeviceptr at, size_t size, int owner) {
  uint64_t granted = 0;
  int count = 0;
  if (api.cuDeviceGetCount(&count) != CUDA_SUCCESS) return granted;
  for (int i = 0; i < count; ++i) {
    int canAccess = 0;
    if (i == owner || api.cuDeviceCanAccessPeer(&canAccess, static_cast<CUdevice>(i), static_cast<CUdevice>(owner)) !=
                          CUDA_SUCCESS || canAccess == 0)
      continue;
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = i;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (CUresult rc = api.cuMemSetAccess(at, size, &access, 1); rc == CUDA_SUCCESS)
      granted |= deviceBit(i);
    else
      SHOAL_WARN("CUDA: device ", i, " was refused access to device ", owner, "'s ncclMemAlloc allocation (",
                 static_cast<int>(rc), "): ranks on device ", i, " cannot copy from it");
  }
  return granted;
}

Result<void*> Driver::deviceAlloc(size_t bytes) {
  SHOAL_ASSIGN_OR_RETURN(std::optional<DeviceIdentity> device, currentDevice());
  if (!device) return error(Code::kInvalidUsage, "no CUDA context is current on this thread");
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device->ordinal;
  // A NIC may DMA into it (ofi with FI_HMEM) only with this flag, which the
  // device must support (asking for it elsewhere fails cuMemCreate).
  int rdma = 0;
  if (api_->cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                 static_cast<CUdevice>(device->ordinal)) == CUDA_SUCCESS && rdma)
    prop.allocFlags.gpuDirectRDMACapable = 1;
  size_t granularity = 0;
  SHOAL_CU(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  if (granularity == 0) granularity = 2u << 20;
  size_t size = (std::max<size_t>(bytes, 1) + granularity - 1) / granularity * granularity;
  CUmemGenericAllocationHandle handle = 0;
  SHOAL_CU(cuMemCreate(&handle, size, &prop, 0));
  SHOAL_ASSIGN_OR_RETURN(void* at, mapAllocation(*api_, handle, size, granularity, prop.location,
                                                 "ncclMemAlloc: mapping a cuMem allocation"));
  const uint64_t granted = grantPeerAccess(*api_, reinterpret_cast<CUdeviceptr>(at), size, device->ordinal);
  std::lock_guard<std::mutex> lock(api_->mutex);
  api_->deviceAllocations[reinterpret_cast<uintptr_t>(at)].reachableFrom |= granted;
  return at;
}

bool Driver::deviceFree(void* ptr) {
  Api::DeviceAllocation allocation{};
  {
    std::lock_guard<std::mutex> lock(api_->mutex);
    auto it = api_->deviceAllocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == api_->deviceAllocations.end()) return false;
    allocation = it->second;
    api_->deviceAllocations.erase(it);
  }
  auto at = reinterpret_cast<CUdeviceptr>(ptr);
  (void)api_->cuMemUnmap(at, allocation.bytes);
  (void)api_->cuMemAddressFree(at, allocation.bytes);
  (void)api_->cuMemRelease(allocation.handle);
  return true;
}

// The ordinal in this process of the GPU named "GPU-<uuid>", -1 if none.
static Result<int> ordinalOf(Driver::Api& api, const std::string& gpu) {
  int count = 0;
  CUresult rc = api.cuDeviceGetCount(&count);
  if (rc != CUDA_SUCCESS) return cudaError(api, "cuDeviceGetCount", rc);
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    rc = api.cuDeviceGet(&dev, i);
    if (rc != CUDA_SUCCESS) return cudaError(api, "cuDeviceGet", rc);
    CUuuid uuid{};
    rc = api.cuDeviceGetUuid(&uuid, dev);
    if (rc != CUDA_SUCCESS) return cudaError(api, "cuDeviceGetUuid", rc);
    DeviceIdentity id;
    for (int b = 0; b < 16; ++b) id.uuid[b] = static_cast<uint8_t>(uuid.bytes[b]);
    if (id.uuidText() == gpu) return static_cast<int>(dev);
  }
  return -1;
}
Result<ContextHandle> Driver::primaryContext(const std::string& gpu) {
  SHOAL_ASSIGN_OR_RETURN(int ordinal, ordinalOf(*api_, gpu));
  if (ordinal < 0) return error(Code::kInvalidUsage, "no CUDA device of this process is ", gpu);
  return primaryContextOfDevice(ordinal);
}
Result<ContextHandle> Driver::primaryContextOfDevice(int ordinal) {
  std::lock_guard<std::mutex> lock(api_->mutex);
  auto it = api_->primaryContexts.find(ordinal);
  if (it != api_->primaryContexts.end()) return static_cast<ContextHandle>(it->second);
  CUcontext ctx = nullptr;  // retained once per device, for the process (as the runtime does)
  SHOAL_CU(cuDevicePrimaryCtxRetain(&ctx, static_cast<CUdevice>(ordinal)));
  api_->primaryContexts[ordinal] = ctx;
  return static_cast<ContextHandle>(ctx);
}
// A GPU CUDA_VISIBLE_DEVICES hides from this process (each process given
// one GPU) cannot be asked about through CUDA; NVML sees the GPUs
// CUDA_VISIBLE_DEVICES hides. CUDA maps another process's memory on a GPU it does not see
// where the two GPUs have peer access, as NCCL relies on too. Each pair's
// verdict is kept and said once.
static bool hiddenGpusShareMemory(const std::string& a, const std::string& b) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, std::string>, bool> verdicts;
  std::lock_guard<std::mutex> lock(mutex);
  auto key = a < b ? std::pair{a, b} : std::pair{b, a};
  if (auto it = verdicts.find(key); it != verdicts.end()) return it->second;
  Result<bool> access = nvml::peerAccess(a, b);
  const bool shared = access.isOk() && access.value();
  verdicts[key] = shared;
  SHOAL_INFO(subsys::kInit, "CUDA: ", key.first, " and ", key.second, ", one of them hidden from this process ",
             "(CUDA_VISIBLE_DEVICES): ",
             access.isOk() ? (shared ? "NVML reports peer access both ways" : "NVML reports no peer access")
                           : str("no peer access assumed: ", access.status().message()));
  return shared;
}

bool Driver::gpusShareMemory(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  if (a == b) return true;
  auto first = ordinalOf(*api_, a);
  auto second = ordinalOf(*api_, b);
  if (!first.isOk() || !second.isOk()) return false;
  if (first.value() < 0 || second.value() < 0) return hiddenGpusShareMemory(a, b);
  // Both ways: each rank asks this of the other's GPU, and the two must agree.
  int ab = 0, ba = 0;
  auto a2 = static_cast<CUdevice>(first.value());
  auto b2 = static_cast<CUdevice>(second.value());
  return api_->cuDeviceCanAccessPeer(&ab, a2, b2) == CUDA_SUCCESS && ab != 0 &&
         api_->cuDeviceCanAccessPeer(&ba, b2, a2) == CUDA_SUCCESS && ba != 0;
}
// Whether this thread, one of Shoal's own (markLibraryThread), took relaxed
// capture mode yet.
static thread_local bool tLibraryThreadRelaxed = false;

Status Driver::pushContext(ContextHandle context) {
  SHOAL_CU(cuCtxPushCurrent(static_cast<CUcontext>(context)));
  // While another thread of the process captures in global mode
  // (torch.cuda.graph's default), CUDA refuses potentially unsafe calls
  // (synchronizing, querying events, allocating, freeing) on every thread
  // still in global mode, and may invalidate that capture. Shoal's own
  // threads make such calls at any moment, always under a pushed context:
  // at their first push they take relaxed mode for good. A user's thread
  // keeps its mode.
  if (isLibraryThread() && !tLibraryThreadRelaxed) {
    (void)exchangeCaptureMode(kCaptureModeRelaxed);
    tLibraryThreadRelaxed = true;
  }
  return Status::ok();
}
void Driver::popContext() {
  CUcontext popped = nullptr;
  (void)api_->cuCtxPopCurrent(&popped);
}
Result<StreamHandle> Driver::createStream() {
  CUstream stream = nullptr;
  SHOAL_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  return static_cast<StreamHandle>(stream);
}
void Driver::destroyStream(StreamHandle stream) {
  if (stream) (void)api_->cuStreamDestroy(static_cast<CUstream>(stream));
}
Result<bool> Driver::eventDone(EventHandle event) {
  CUresult rc = api_->cuEventQuery(static_cast<CUevent>(event));
  if (rc == CUDA_SUCCESS) return true;
  if (rc == CUDA_ERROR_NOT_READY) return false;
  return cudaError(*api_, "cuEventQuery", rc);
}
std::optional<Driver::DeviceAllocation> Driver::deviceAllocationOf(const void* ptr, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(api_->mutex);
  auto it = api_->deviceAllocations.upper_bound(at);
  if (it == api_->deviceAllocations.begin()) return std::nullopt;
  --it;
  if (!rangeInside(at, bytes, it->first, it->second.bytes)) return std::nullopt;
  return DeviceAllocation{reinterpret_cast<uint8_t*>(it->first), it->second.bytes, it->second.serial,
                          it->second.reachableFrom};
}
bool Driver::reachableFrom(const void* ptr, size_t bytes, const std::string& gpu) {
  Result<int> ordinal = ordinalOf(*api_, gpu);
  if (!ordinal.isOk() || ordinal.value() < 0) return false;
  std::optional<DeviceAllocation> allocation = deviceAllocationOf(ptr, bytes);
  return allocation && (allocation->reachableFrom & deviceBit(ordinal.value())) != 0;
}

Result<Driver::Exported> Driver::exportDeviceMemory(void* ptr) {
  CUmemGenericAllocationHandle handle = 0;
  Exported exported;
  {
    std::lock_guard<std::mutex> lock(api_->mutex);
    auto it = api_->deviceAllocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == api_->deviceAllocations.end())
      return error(Code::kInvalidUsage, ptr, " is not a Shoal device allocation");
    handle = it->second.handle;
    exported.bytes = it->second.bytes;
  }
  SHOAL_CU(cuMemExportToShareableHandle(&exported.fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  return exported;
}
Result<void*> Driver::importDeviceMemory(int fd, size_t bytes) {
  SHOAL_ASSIGN_OR_RETURN(std::optional<DeviceIdentity> device, currentDevice());
  if (!device) return error(Code::kInvalidUsage, "no CUDA context is current on this thread");
  CUmemGenericAllocationHandle handle = 0;
  SHOAL_CU(cuMemImportFromShareableHandle(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device->ordinal;
  size_t granularity = 0;
  CUresult rc = api_->cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (rc != CUDA_SUCCESS || granularity == 0) granularity = 2u << 20;
  if (bytes == 0 || bytes % granularity != 0) {
    (void)api_->cuMemRelease(handle);
    return error(Code::kInvalidArgument, "imported device memory of ", bytes,
                 " bytes is not a multiple of this device's granularity ", granularity);
  }
  return mapAllocation(*api_, handle, bytes, granularity, prop.location, "mapping device memory of another process");
}
#endif  // SHOAL_HAVE_CUDA

}  // namespace shoal::cuda
