// CUDA for the perf benchmarks' device-memory mode; see device.h.
#include "device.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "report.h"
#include "world.h"

#if SHOAL_HAVE_CUDA
#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <mutex>
#endif

namespace shoal::perf {

#if !SHOAL_HAVE_CUDA

// Built without CUDA's headers: host memory only. loadDriver() says so, and
// runPerf never makes a RankDevice.

namespace {
[[noreturn]] void notBuilt() {
  std::printf("%s: device memory requested, but this benchmark was built without CUDA\n",
              shortHostName().c_str());
  Process::abortJob(2);
}
}  // namespace

std::string loadDriver() { return "built without CUDA"; }
std::string driverPath() { return std::string(); }
int deviceCount() { return 0; }
std::string describeDevice(int) { return "[none]"; }

RankDevice::RankDevice(int ordinal, bool) : ordinal_(ordinal) { notBuilt(); }
RankDevice::~RankDevice() = default;
void RankDevice::synchronize() { notBuilt(); }
void RankDevice::copyToDevice(void*, const void*, size_t) { notBuilt(); }
void RankDevice::copyToHost(void*, const void*, size_t) { notBuilt(); }
void RankDevice::fill(void*, unsigned char, size_t) { notBuilt(); }
void RankDevice::captureGraph(const std::function<void()>&) { notBuilt(); }
void RankDevice::launchGraph() { notBuilt(); }
void RankDevice::dropGraph() {}

#else

namespace {

// Every entry point is asked for with the signature it had in CUDA 12.0
// (decltype of cuda.h's declaration, which names that version).
constexpr int kApiVersion = 12000;

// The driver functions the benchmark calls. cuda.h maps some base names to
// versioned ones (cuStreamDestroy is cuStreamDestroy_v2): the fields take the
// versioned name, the lookup the base name, as cuGetProcAddress wants.
#define SHOAL_PERF_CUDA_FUNCTIONS(X)                                                   \
  X(cuInit) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount) X(cuDeviceGet)   \
  X(cuDeviceGetName) X(cuDeviceGetPCIBusId) X(cuDevicePrimaryCtxRetain)                \
  X(cuCtxSetCurrent) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)       \
  X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemsetD8Async) X(cuStreamBeginCapture)   \
  X(cuStreamEndCapture) X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphExecDestroy) \
  X(cuGraphDestroy)

struct Api {
#define SHOAL_PERF_CUDA_FIELD(name) decltype(&::name) name = nullptr;
  SHOAL_PERF_CUDA_FUNCTIONS(SHOAL_PERF_CUDA_FIELD)
#undef SHOAL_PERF_CUDA_FIELD
};

struct Driver {
  std::once_flag once;
  std::string problem;  // empty: usable
  std::string path;
  int devices = 0;
  Api api;
};

Driver& driver() {
  static Driver* d = new Driver;  // lives for the process, as the library it loads
  return *d;
}

std::string errorText(CUresult rc) {
  const Api& api = driver().api;
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName) (void)api.cuGetErrorName(rc, &name);
  if (api.cuGetErrorString) (void)api.cuGetErrorString(rc, &text);
  std::string out = name ? name : "CUDA error " + std::to_string(static_cast<int>(rc));
  if (text) out += std::string(" (") + text + ")";
  return out;
}

std::string openDriver(Driver& d) {
  const char* named = std::getenv("SHOAL_CUDA_DRIVER");
  d.path = named != nullptr && *named != '\0' ? named : "libcuda.so.1";
  // RTLD_GLOBAL, and never closed: the NCCL library looks for this very
  // library among those the process has loaded (RTLD_NOLOAD).
  void* library = ::dlopen(d.path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (library == nullptr) {
    const char* why = ::dlerror();
    return why != nullptr ? std::string(why) : d.path + ": cannot be loaded";
  }
  using GetProcAddress =
      CUresult (*)(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                   CUdriverProcAddressQueryResult* status);
  const auto getProcAddress =
      reinterpret_cast<GetProcAddress>(::dlsym(library, "cuGetProcAddress_v2"));
  if (getProcAddress == nullptr) {
    return d.path + " has no cuGetProcAddress_v2 (a driver older than CUDA 12.0)";
  }
  std::string missing;
#define SHOAL_PERF_CUDA_RESOLVE(name)                                                     \
  {                                                                                        \
    void* function = nullptr;                                                              \
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;           \
    if (getProcAddress(#name, &function, kApiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &found) \
            != CUDA_SUCCESS ||                                                             \
        function == nullptr) {                                                             \
      missing += " " #name;                                                                \
    }                                                                                      \
    d.api.name = reinterpret_cast<decltype(d.api.name)>(function);                         \
  }
  SHOAL_PERF_CUDA_FUNCTIONS(SHOAL_PERF_CUDA_RESOLVE)
#undef SHOAL_PERF_CUDA_RESOLVE
  if (!missing.empty()) return d.path + " lacks" + missing;
  if (const CUresult rc = d.api.cuInit(0); rc != CUDA_SUCCESS) {
    return "cuInit failed: " + errorText(rc);
  }
  int count = 0;
  if (const CUresult rc = d.api.cuDeviceGetCount(&count); rc != CUDA_SUCCESS) {
    return "cuDeviceGetCount failed: " + errorText(rc);
  }
  d.devices = count;
  return std::string();
}

// A failed CUDA call ends the job, as any NCCL error does.
void checkCuda(CUresult rc, const char* function, int line) {
  if (rc == CUDA_SUCCESS) return;
  std::printf("%s: Test CUDA failure device.cc:%d '%s' in %s\n", shortHostName().c_str(), line,
              errorText(rc).c_str(), function);
  Process::abortJob(2);
}
// CU_OK(cuStreamSynchronize, (stream)): the call through the loaded table.
#define CU_OK(function, args) checkCuda(driver().api.function args, #function, __LINE__)

CUdeviceptr devicePointer(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace

std::string loadDriver() {
  Driver& d = driver();
  std::call_once(d.once, [&d] { d.problem = openDriver(d); });
  return d.problem;
}

std::string driverPath() { return driver().path; }

int deviceCount() { return driver().problem.empty() ? driver().devices : 0; }

std::string describeDevice(int ordinal) {
  const Api& api = driver().api;
  CUdevice device = 0;
  char name[256] = "?";
  char bus[64] = "?";
  if (api.cuDeviceGet(&device, ordinal) == CUDA_SUCCESS) {
    if (api.cuDeviceGetName(name, sizeof name, device) != CUDA_SUCCESS) std::strcpy(name, "?");
    if (api.cuDeviceGetPCIBusId(bus, sizeof bus, device) == CUDA_SUCCESS) {
      // "0000:07:00.0" -> "0000:07:00", as nccl-tests prints it.
      if (char* function = std::strrchr(bus, '.')) *function = '\0';
    } else {
      std::strcpy(bus, "?");
    }
  }
  return std::string("[") + bus + "] " + name;
}

RankDevice::RankDevice(int ordinal, bool nullStream) : ordinal_(ordinal) {
  CUdevice device = 0;
  CU_OK(cuDeviceGet, (&device, ordinal));
  // The primary context, as the CUDA runtime (and nccl-tests' cudaSetDevice)
  // uses. It stays retained until the process exits, as the runtime's does:
  // the NCCL library may still hold memory in it after its communicators.
  CUcontext context = nullptr;
  CU_OK(cuDevicePrimaryCtxRetain, (&context, device));
  context_ = context;
  CU_OK(cuCtxSetCurrent, (context));
  if (!nullStream) {
    CUstream stream = nullptr;
    CU_OK(cuStreamCreate, (&stream, CU_STREAM_NON_BLOCKING));
    stream_ = stream;
    ownsStream_ = true;
  }
}

RankDevice::~RankDevice() {
  dropGraph();
  if (!ownsStream_) return;
  synchronize();
  CU_OK(cuStreamDestroy, (stream_));
}

void RankDevice::captureGraph(const std::function<void()>& calls) {
  dropGraph();
  CU_OK(cuStreamBeginCapture, (stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  calls();
  CUgraph graph = nullptr;
  CU_OK(cuStreamEndCapture, (stream_, &graph));
  graph_ = graph;
  CUgraphExec exec = nullptr;
  CU_OK(cuGraphInstantiateWithFlags, (&exec, graph, 0));
  graphExec_ = exec;
}

void RankDevice::launchGraph() { CU_OK(cuGraphLaunch, (static_cast<CUgraphExec>(graphExec_), stream_)); }

void RankDevice::dropGraph() {
  if (graphExec_ == nullptr) return;
  synchronize();  // no launch of it is left on the stream
  CU_OK(cuGraphExecDestroy, (static_cast<CUgraphExec>(graphExec_)));
  CU_OK(cuGraphDestroy, (static_cast<CUgraph>(graph_)));
  graphExec_ = graph_ = nullptr;
}

void RankDevice::synchronize() { CU_OK(cuStreamSynchronize, (stream_)); }

void RankDevice::copyToDevice(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return;
  CU_OK(cuMemcpyHtoDAsync, (devicePointer(device), host, bytes, stream_));
  synchronize();
}

void RankDevice::copyToHost(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return;
  CU_OK(cuMemcpyDtoHAsync, (host, devicePointer(device), bytes, stream_));
  synchronize();
}

void RankDevice::fill(void* device, unsigned char value, size_t bytes) {
  if (bytes == 0) return;
  CU_OK(cuMemsetD8Async, (devicePointer(device), value, bytes, stream_));
  synchronize();
}

#undef CU_OK
#endif  // SHOAL_HAVE_CUDA

}  // namespace shoal::perf
