// Driver: the one place Shoal calls CUDA (the driver API of libcuda.so.1).
//
// Role: answers what kind of memory a pointer is, which GPU the calling
// thread's context is on, and enqueues the stream work of a device-memory
// operation (copies, stream memory operations, events). It never loads CUDA
// into a process that does not use it: Driver::inUse() finds libcuda only
// when the process already has it loaded (dlopen with RTLD_NOLOAD), resolves
// every entry point through cuGetProcAddress, and links nothing at build
// time (libnccl.so.2 has no NEEDED entry on a CUDA library). SHOAL_CUDA_DRIVER
// names another driver library (tests load a stand-in, tests/cudafake).
//
// Threading: every method may be called from any thread; CUDA calls need the
// context the caller made current (the user's thread: its stream's context).
// The engine hands stream-ordered jobs over without CUDA calls: the words a
// stream writes and waits for are plain pinned host memory that the engine
// reads and writes. Inside a job, cuda_ipc connections and a device plan's
// steps call CUDA with their own context pushed for the call.
//
// Without the CUDA toolkit at build time (SHOAL_HAVE_CUDA unset) inUse() is
// always null and the library runs on host memory only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "core/status.h"

namespace shoal::cuda {

// CUstream / cudaStream_t, CUevent, CUcontext, CUmodule and CUfunction,
// which are pointers, without cuda.h.
using StreamHandle = void*;
using EventHandle = void*;
using ContextHandle = void*;
using ModuleHandle = void*;
using FunctionHandle = void*;
using GraphHandle = void*;  // CUgraph

// What CUDA says a pointer is. kHost: memory CUDA does not know (pageable).
enum class MemoryKind : uint8_t { kHost, kPinnedHost, kDevice, kManaged };
const char* memoryKindName(MemoryKind kind);
// Memory only stream order may touch: device or managed memory, and pinned
// host memory (which a GPU may be writing).
inline bool knownToCuda(MemoryKind kind) { return kind != MemoryKind::kHost; }

struct DeviceIdentity {
  int ordinal = -1;                 // in this process (CUDA_VISIBLE_DEVICES applies)
  std::array<uint8_t, 16> uuid{};   // the same GPU has the same UUID in every process
  std::string uuidText() const;     // "GPU-xxxxxxxx-xxxx-..."
};

// How a stream and the engine hand a job over (docs/cuda.md).
enum class WaitMode : uint8_t {
  kMemOps,       // cuStreamWriteValue64 / cuStreamWaitValue64 on pinned words
  kWaitKernel,   // words copied by cuMemcpyAsync; a one-thread kernel waits
  kSynchronous,  // the caller synchronizes its stream and runs the job itself
};
const char* waitModeName(WaitMode mode);

class Driver {
 public:
  // The driver when this process uses CUDA (its driver library is loaded and
  // initializes), else null. Looked up again on every call until found (a
  // process may load CUDA after its first call); once found it stays for the
  // process, and a loaded driver that was refused (too old, cuInit failed)
  // is not asked again.
  static Driver* inUse();
  // Whether the library was built with the device-memory path.
  static bool built();

  Result<MemoryKind> memoryKind(const void* ptr);
  // What memory is at ptr and, for device or managed memory, the ordinal (in
  // this process) of the device that holds it (-1 otherwise), asked of the
  // driver at once.
  struct Place {
    MemoryKind kind = MemoryKind::kHost;
    int device = -1;
  };
  Result<Place> placeOf(const void* ptr);
  // The device of the context current on the calling thread; nullopt when no
  // context is current.
  Result<std::optional<DeviceIdentity>> currentDevice();
  // How stream-ordered jobs synchronize with the engine on `device`, the
  // first that works of: stream memory operations, the wait kernel,
  // synchronous (SHOAL_CUDA_WAIT may start lower). Decided on the calling
  // thread with the device's context current (the kernel is loaded then, not
  // at a later first launch); logged once per device at INFO.
  WaitMode waitMode(int device);
  // A memory operation failed as unsupported: later jobs on the device use
  // the next mode.
  void memOpsUnsupported(int device);
  // Whether operations may run whole on the streams of the GPU named
  // "GPU-<uuid>" (stream plans: cuda_ipc's stream rings, window boards): its
  // streams run stream memory operations, and SHOAL_CUDA_STREAM_PLANS
  // allows it (auto: unless CUDA_DEVICE_MAX_CONNECTIONS is below 4).
  bool streamPlansWanted(const std::string& gpu);
  // CUDA_DEVICE_MAX_CONNECTIONS is 1 to 3 (some trainers set 1): so few
  // hardware queues that a user stream waiting for the host blocks work the
  // host then issues on other streams of the device (device plans, stream
  // plans' lanes), which would deadlock.
  static bool fewHardwareQueues();

  Result<bool> isCapturing(StreamHandle stream);

  // --- CUDA graphs: an operation enqueued on a stream being captured is
  // recorded, and replayed at every launch of the graph (docs/cuda.md).
  // Whether the driver has what capture needs (cuStreamGetCaptureInfo,
  // host functions, user objects, capture modes).
  bool capturesGraphs() const;
  // The graph being captured on `stream`; null when it is not capturing.
  Result<GraphHandle> captureGraph(StreamHandle stream);
  // Enqueues fn(arg) on the stream (a host node in a capture). fn must make
  // no CUDA call and must not block.
  Status launchHostFunction(StreamHandle stream, void (*fn)(void*), void* arg);
  // Hands `object` to the graph: destroy(object) runs once the graph and
  // every executable graph made from it are gone and their launches have
  // run (a CUDA user object), later, on a driver thread, where it may make
  // no CUDA call. If this fails, destroy runs (maybe later) all the same.
  Status tieToGraph(GraphHandle graph, void* object, void (*destroy)(void*));
  // Sets this thread's capture mode; returns the previous one (CUstreamCaptureMode).
  int exchangeCaptureMode(int mode);
  static constexpr int kCaptureModeRelaxed = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED
  // The context a stream belongs to (for the special streams, the current one).
  Result<ContextHandle> streamContext(StreamHandle stream);
  // NULL, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD: a stream of whatever
  // context is current.
  static bool specialStream(StreamHandle stream) { return reinterpret_cast<uintptr_t>(stream) <= 2; }
  Status copyAsync(void* dst, const void* src, size_t bytes, StreamHandle stream);
  Status copy(void* dst, const void* src, size_t bytes);
  // Stream memory operations on a 64-bit word of pinned host memory: the
  // stream writes `value` once its earlier work is done; waits until
  // (int64_t)(*word - value) >= 0 before running later work.
  Status writeValueAsync(uint64_t* word, uint64_t value, StreamHandle stream);
  // Writes of words `base[offset] = value` of one registration of pinned
  // host memory, in order, as one batch of stream memory operations (one
  // call and one device command: cuStreamBatchMemOp) where the driver has
  // it, else one by one; at most kMaxBatchedWrites per call.
  struct WordWrite {
    size_t offset;  // in words from base
    uint64_t value;
  };
  static constexpr size_t kMaxBatchedWrites = 255;  // cuStreamBatchMemOp takes fewer than 256
  Status writeValuesAsync(uint64_t* base, std::span<const WordWrite> writes, StreamHandle stream);
  Status waitValueAsync(const uint64_t* word, uint64_t value, StreamHandle stream);
  // Waits until *word == value exactly (a peer's descriptor, not a count).
  Status waitValueEqualAsync(const uint64_t* word, uint64_t value, StreamHandle stream);
  // The wait kernel: the stream's later work waits until
  // (int64_t)(*word - value) >= 0 (waitMode kWaitKernel only).
  Status launchWait(const uint64_t* word, uint64_t value, StreamHandle stream);
  Status synchronize(StreamHandle stream);

  // The context current on the calling thread (null when none is).
  Result<ContextHandle> currentContext();
  // The current context's instance: an id no other context of the process
  // ever has (cuCtxGetId, CUDA 12.0), not even one made at the same handle
  // after a reset (cuDevicePrimaryCtxReset, cudaDeviceReset), whose modules
  // are gone; the handle's value where the driver lacks it; 0 when none is
  // current. Keys what is loaded per context.
  Result<uint64_t> currentContextInstance();
  // Whether `context` is still the instance `instance` (false once it was
  // destroyed or reset, and with it the memory allocated in it; true where
  // the driver cannot tell).
  bool contextStillThere(ContextHandle context, uint64_t instance);
  // Streaming multiprocessors of the current context's device.
  Result<int> multiprocessorCount();
  // Modules and kernels, in the calling thread's current context. `what`
  // names the image in errors. moduleFunction loads the kernel completely now
  // (cuModuleGetFunction, then cuFuncLoad where the driver has it, 12.4 on):
  // with lazy loading (the default since CUDA 12.2) a kernel first loaded at
  // a launch may need a context-wide synchronization, which deadlocks while
  // a stream waits for work still to come. A kernel the module lacks is an
  // internal error naming it.
  Result<ModuleHandle> loadModule(const void* image, const char* what);
  Result<FunctionHandle> moduleFunction(ModuleHandle module, const char* name);
  void unloadModule(ModuleHandle module);
  // Launches `kernel` with a 1-D grid and block; args as cuLaunchKernel's
  // kernelParams.
  Status launch(FunctionHandle kernel, unsigned blocks, unsigned threads, void** args,
                StreamHandle stream);

  Result<EventHandle> createEvent();
  void destroyEvent(EventHandle event);
  Status recordEvent(EventHandle event, StreamHandle stream);
  Status streamWaitEvent(StreamHandle stream, EventHandle event);

  // Pinned host memory (portable: every context may use it).
  Result<void*> hostAlloc(size_t bytes);
  void hostFree(void* ptr);
  // Makes host memory [ptr, ptr + bytes) pinned, portable and mapped for
  // the GPUs (cuMemHostRegister), so that stream memory operations may wait
  // on and write its words (writeValueAsync, waitValueAsync);
  // unregisterHost undoes it. Page-aligned.
  Status registerHost(void* ptr, size_t bytes);
  void unregisterHost(void* ptr);
  // Device memory for ncclMemAlloc on a device: a cuMem allocation of the
  // current context's device, exportable as a POSIX file descriptor.
  Result<void*> deviceAlloc(size_t bytes);
  // False when ptr is not an allocation of deviceAlloc.
  bool deviceFree(void* ptr);
  // The deviceAlloc (or importDeviceMemory) allocation holding all of
  // [ptr, ptr + bytes), if one does; its serial is unique in this process
  // for as long as it runs (addresses are reused, serials are not).
  struct DeviceAllocation {
    uint8_t* base = nullptr;
    size_t bytes = 0;
    uint64_t serial = 0;
    uint64_t reachableFrom = 0;  // bit d: device ordinal d was granted access
  };
  std::optional<DeviceAllocation> deviceAllocationOf(const void* ptr, size_t bytes);
  // Whether [ptr, ptr + bytes) lies in one such allocation that the GPU
  // named "GPU-<uuid>" (of this process) was granted access to: its own
  // device's, and deviceAlloc's to every GPU with peer access to it.
  bool reachableFrom(const void* ptr, size_t bytes, const std::string& gpu);

  // --- For transports that move device memory (cuda_ipc, loopback).
  // The primary context of the GPU named "GPU-<uuid>", retained once per
  // device for the process; an error when no visible device has that UUID.
  Result<ContextHandle> primaryContext(const std::string& gpu);
  // The same for the device of that ordinal in this process.
  Result<ContextHandle> primaryContextOfDevice(int ordinal);
  // How streams on the GPU named "GPU-<uuid>" hand work over (waitMode of its
  // ordinal in this process); kSynchronous when no visible device has it.
  WaitMode waitModeOf(const std::string& gpu);
  // Whether GPUs `a` and `b` ("GPU-<uuid>") reach each other's memory: the
  // same GPU, or two GPUs with peer access both ways (CUDA's answer where
  // this process sees both, NVML's where CUDA_VISIBLE_DEVICES hides one).
  bool gpusShareMemory(const std::string& a, const std::string& b);
  // Makes `context` current on the calling thread until popContext().
  Status pushContext(ContextHandle context);
  void popContext();
  // A stream that does not synchronize with the legacy default stream.
  Result<StreamHandle> createStream();
  void destroyStream(StreamHandle stream);
  // Whether the work recorded in `event` has run.
  Result<bool> eventDone(EventHandle event);
  // A new file descriptor for the deviceAlloc allocation that starts at
  // `ptr`, and the allocation's size (granularity-rounded), which another
  // process passes to importDeviceMemory.
  struct Exported {
    int fd = -1;
    size_t bytes = 0;
  };
  Result<Exported> exportDeviceMemory(void* ptr);
  // Maps memory another process exported (its descriptor and allocation
  // size) into this process, read-write for the current context's device;
  // deviceFree() unmaps it. The descriptor stays the caller's.
  Result<void*> importDeviceMemory(int fd, size_t bytes);

  struct Api;  // the resolved entry points (driver.cc)

 private:
  explicit Driver(Api* api) : api_(api) {}
  Api* api_;
};

// Relaxed stream capture mode on this thread for the scope's life, so that
// allocations made while a stream is being captured (staging held by the
// graph) do not invalidate the capture, as NCCL's do.
class RelaxedCaptureScope {
 public:
  explicit RelaxedCaptureScope(Driver& driver)
      : driver_(driver), previous_(driver.exchangeCaptureMode(Driver::kCaptureModeRelaxed)) {}
  ~RelaxedCaptureScope() { (void)driver_.exchangeCaptureMode(previous_); }
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  Driver& driver_;
  int previous_;
};

// Makes a context current on this thread for the scope's life: pushed at
// construction, popped at the end on every path. No driver or no context
// pushes nothing (entered() false, status() ok), nor does the context
// already current (entered() true); a refused push leaves nothing to pop
// and says why in status().
class ContextScope {
 public:
  ContextScope(Driver* driver, ContextHandle context) {
    if (driver == nullptr || context == nullptr) return;
    if (Result<ContextHandle> current = driver->currentContext(); current.isOk() && current.value() == context) {
      alreadyCurrent_ = true;
      return;
    }
    status_ = driver->pushContext(context);
    if (status_.isOk()) driver_ = driver;
  }
  ContextScope(Driver& driver, ContextHandle context) : ContextScope(&driver, context) {}
  ~ContextScope() {
    if (driver_) driver_->popContext();
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  // Whether the context is current in the scope.
  bool entered() const { return driver_ != nullptr || alreadyCurrent_; }
  const Status& status() const { return status_; }

 private:
  Driver* driver_ = nullptr;  // set when a push is to be popped
  bool alreadyCurrent_ = false;
  Status status_;
};

}  // namespace shoal::cuda
