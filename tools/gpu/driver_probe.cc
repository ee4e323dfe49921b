// What the CUDA driver answers to the calls Shoal's driver stand-in
// (tests/cudafake) refuses on purpose, so that a GPU run says whether the
// stand-in is as strict as the driver, no stricter where it matters:
//   - a pointer query on a thread with no context current;
//   - cuFuncLoad asked for as of CUDA 12.0 (it came in 12.4);
//   - cuMemHostGetDevicePointer on memory allocated without DEVICEMAP;
//   - querying an event and synchronizing a stream on a thread in global
//     capture mode while another thread captures in global mode, then the
//     same in relaxed mode, and whether that capture survives;
//   - freeing pinned memory on a thread capturing in relaxed mode;
//   - whether creating a stream or an event returns while another stream
//     waits (cuStreamWaitValue64) for a word the host has yet to write, as
//     Shoal's engine may create one while a user's stream waits for it.
// One line per question: "<question>: <CUresult name>". Loads the driver
// with dlopen (SHOAL_CUDA_DRIVER, else libcuda.so.1) and resolves every entry
// point through cuGetProcAddress_v2, as Shoal does; links no CUDA library.
// Exit status 0 when every question was asked, 77 without a driver or GPU,
// 1 when a set-up call failed.
//
//   g++ -std=c++20 -I/usr/local/cuda/include tools/gpu/driver_probe.cc -ldl -pthread
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
GetProc gGetProc = nullptr;

template <typename Fn>
Fn entry(const char* name, int version = 12000) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (gGetProc(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS || fn == nullptr) {
    std::printf("set-up: %s not found\n", name);
    std::exit(1);
  }
  return reinterpret_cast<Fn>(fn);
}

decltype(&cuGetErrorName) errorName;

const char* nameOf(CUresult rc) {
  const char* name = nullptr;
  if (errorName(rc, &name) != CUDA_SUCCESS || name == nullptr) return "unknown CUresult";
  return name;
}

void answer(const char* question, CUresult rc) { std::printf("%s: %s\n", question, nameOf(rc)); }

#define MUST(call)                                                     \
  do {                                                                 \
    CUresult rc_ = (call);                                             \
    if (rc_ != CUDA_SUCCESS) {                                         \
      std::printf("set-up: %s failed: %s\n", #call, nameOf(rc_));      \
      return 1;                                                        \
    }                                                                  \
  } while (0)

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* path = std::getenv("SHOAL_CUDA_DRIVER");
  void* lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::printf("no CUDA driver: %s\n", dlerror());
    return 77;
  }
  gGetProc = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
  if (gGetProc == nullptr) {
    std::printf("no cuGetProcAddress_v2 in the driver\n");
    return 77;
  }
  errorName = entry<decltype(&cuGetErrorName)>("cuGetErrorName");
  auto init = entry<decltype(&cuInit)>("cuInit");
  if (CUresult rc = init(0); rc != CUDA_SUCCESS) {
    std::printf("cuInit: %s\n", nameOf(rc));
    return 77;
  }
  auto retain = entry<decltype(&cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain");
  auto setCurrent = entry<decltype(&cuCtxSetCurrent)>("cuCtxSetCurrent");
  auto memAlloc = entry<decltype(&cuMemAlloc)>("cuMemAlloc");
  auto memFree = entry<decltype(&cuMemFree)>("cuMemFree");
  auto hostAlloc = entry<decltype(&cuMemHostAlloc)>("cuMemHostAlloc");
  auto hostFree = entry<decltype(&cuMemFreeHost)>("cuMemFreeHost");
  auto hostDevicePointer = entry<decltype(&cuMemHostGetDevicePointer)>("cuMemHostGetDevicePointer");
  auto pointerAttributes = entry<decltype(&cuPointerGetAttributes)>("cuPointerGetAttributes");
  auto streamCreate = entry<decltype(&cuStreamCreate)>("cuStreamCreate");
  auto streamDestroy = entry<decltype(&cuStreamDestroy)>("cuStreamDestroy");
  auto streamSynchronize = entry<decltype(&cuStreamSynchronize)>("cuStreamSynchronize");
  auto eventCreate = entry<decltype(&cuEventCreate)>("cuEventCreate");
  auto eventRecord = entry<decltype(&cuEventRecord)>("cuEventRecord");
  auto eventQuery = entry<decltype(&cuEventQuery)>("cuEventQuery");
  auto beginCapture = entry<decltype(&cuStreamBeginCapture)>("cuStreamBeginCapture");
  auto endCapture = entry<decltype(&cuStreamEndCapture)>("cuStreamEndCapture");
  auto graphDestroy = entry<decltype(&cuGraphDestroy)>("cuGraphDestroy");
  auto exchangeMode = entry<decltype(&cuThreadExchangeStreamCaptureMode)>("cuThreadExchangeStreamCaptureMode");

  CUcontext ctx = nullptr;
  MUST(retain(&ctx, 0));
  MUST(setCurrent(ctx));
  CUdeviceptr device = 0;
  MUST(memAlloc(&device, 1 << 20));
  std::vector<char> pageable(4096);

  // A pointer query on a thread that never made a context current.
  std::thread([&] {
    unsigned type = 0;
    CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    void* data = &type;
    answer("pointer query of device memory, no context current", pointerAttributes(1, &attr, &data, device));
    answer("pointer query of pageable memory, no context current",
           pointerAttributes(1, &attr, &data, reinterpret_cast<CUdeviceptr>(pageable.data())));
  }).join();

  // cuFuncLoad as of 12.0, then 12.4.
  for (int version : {12000, 12040}) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult rc = gGetProc("cuFuncLoad", &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    std::printf("cuGetProcAddress(cuFuncLoad, %d): %s, status %d, %s\n", version, nameOf(rc), static_cast<int>(found),
                fn ? "a function" : "null");
  }

  // The device pointer of pinned memory allocated without DEVICEMAP.
  {
    void* pinned = nullptr;
    MUST(hostAlloc(&pinned, 4096, CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr mapped = 0;
    answer("cuMemHostGetDevicePointer of memory allocated without DEVICEMAP", hostDevicePointer(&mapped, pinned, 0));
    MUST(hostFree(pinned));
  }

  // Another thread captures in global mode; this one queries and synchronizes.
  {
    CUstream captured = nullptr, other = nullptr;
    CUevent event = nullptr;
    MUST(streamCreate(&captured, CU_STREAM_NON_BLOCKING));
    MUST(streamCreate(&other, CU_STREAM_NON_BLOCKING));
    MUST(eventCreate(&event, CU_EVENT_DISABLE_TIMING));
    MUST(eventRecord(event, other));
    MUST(streamSynchronize(other));
    std::atomic<int> phase{0};
    CUresult began = CUDA_SUCCESS, ended = CUDA_SUCCESS;
    std::thread capturer([&] {
      (void)setCurrent(ctx);
      began = beginCapture(captured, CU_STREAM_CAPTURE_MODE_GLOBAL);
      phase = 1;
      while (phase.load() != 2) std::this_thread::yield();
      CUgraph graph = nullptr;
      ended = endCapture(captured, &graph);
      if (graph) (void)graphDestroy(graph);
      phase = 3;
    });
    while (phase.load() != 1) std::this_thread::yield();
    answer("cuStreamBeginCapture (global) on another thread", began);
    answer("cuEventQuery in global mode during another thread's global capture", eventQuery(event));
    answer("cuStreamSynchronize in global mode during another thread's global capture", streamSynchronize(other));
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    MUST(exchangeMode(&mode));
    answer("cuEventQuery in relaxed mode during another thread's global capture", eventQuery(event));
    answer("cuStreamSynchronize in relaxed mode during another thread's global capture", streamSynchronize(other));
    phase = 2;
    capturer.join();
    answer("that capture's cuStreamEndCapture", ended);
    MUST(exchangeMode(&mode));  // back to global
    MUST(streamDestroy(captured));
    MUST(streamDestroy(other));
  }

  // A free on a thread whose own capture (relaxed mode) is under way.
  {
    CUstream captured = nullptr;
    MUST(streamCreate(&captured, CU_STREAM_NON_BLOCKING));
    void* pinned = nullptr;
    MUST(hostAlloc(&pinned, 4096, CU_MEMHOSTALLOC_PORTABLE));
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    MUST(exchangeMode(&mode));
    MUST(beginCapture(captured, CU_STREAM_CAPTURE_MODE_RELAXED));
    const CUresult freed = hostFree(pinned);
    CUgraph graph = nullptr;
    const CUresult ended = endCapture(captured, &graph);
    if (graph) (void)graphDestroy(graph);
    answer("cuMemFreeHost during this thread's own relaxed capture", freed);
    answer("that capture's cuStreamEndCapture", ended);
    if (freed != CUDA_SUCCESS) (void)hostFree(pinned);
    MUST(exchangeMode(&mode));
    MUST(streamDestroy(captured));
  }
  // Creating a stream and an event while another stream waits for the host.
  {
    auto waitValue = entry<decltype(&cuStreamWaitValue64)>("cuStreamWaitValue64");
    auto eventDestroy = entry<decltype(&cuEventDestroy)>("cuEventDestroy");
    CUstream waiting = nullptr;
    MUST(streamCreate(&waiting, CU_STREAM_NON_BLOCKING));
    void* word = nullptr;
    MUST(hostAlloc(&word, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    auto* value = static_cast<volatile cuuint64_t*>(word);
    *value = 0;
    CUdeviceptr mapped = 0;
    MUST(hostDevicePointer(&mapped, word, 0));
    MUST(waitValue(waiting, mapped, 1, CU_STREAM_WAIT_VALUE_GEQ));
    std::atomic<bool> returned{false};
    // Released after 5 s whatever happens, so that a blocked call returns.
    std::thread release([&] {
      for (int i = 0; i < 500 && !returned.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      *value = 1;
    });
    const auto t0 = std::chrono::steady_clock::now();
    CUstream created = nullptr;
    CUevent event = nullptr;
    const CUresult streamMade = streamCreate(&created, CU_STREAM_NON_BLOCKING);
    const CUresult eventMade = eventCreate(&event, CU_EVENT_DISABLE_TIMING);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const bool releasedFirst = *value == 1;
    returned = true;
    release.join();
    std::printf("cuStreamCreate and cuEventCreate while another stream waits for the host: %s, %s, %.1f ms%s\n",
                nameOf(streamMade), nameOf(eventMade), ms, releasedFirst ? " (blocked until the wait was released)" : "");
    MUST(streamSynchronize(waiting));
    if (created) MUST(streamDestroy(created));
    if (event) MUST(eventDestroy(event));
    MUST(streamDestroy(waiting));
    MUST(hostFree(word));
  }
  MUST(memFree(device));
  return 0;
}
