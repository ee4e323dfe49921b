// A test-only stand-in for the CUDA driver library (libcuda) - see README.md.
//
// It emulates, on the host, the part of the driver API that Shoal uses: devices
// and primary contexts, device/managed/pinned memory, streams run by one worker
// thread each, copies, stream memory operations, events, host functions, stream
// capture bookkeeping, shareable (cuMem VMM) memory backed by memfds, and
// Shoal's kernels by name: the wait kernel (shoal_wait_u64) and the reduction
// kernels (shoal_reduce_<op>_<type>), which run src/reduce/element_ops.h's
// element functions compiled for the host. Device memory is mapped PROT_NONE at the address the
// caller sees, so host code that dereferences it dies at once; the stand-in's
// own work goes through a second, readable and writable mapping of the same
// memfd (the "alias").
//
// Conventions:
//  - Every exported function is extern "C" under the name cuda.h's macros
//    expand to (cuMemAlloc -> cuMemAlloc_v2); defining it against cuda.h's own
//    prototype makes the compiler check each signature.
//  - Every exported function first runs FAKE_ENTER (counting, fail injection,
//    host-function misuse, initialisation) and returns CUresult values only:
//    the body runs under guarded(), so no C++ exception crosses the C boundary.
//  - Driver-wide metadata is guarded by one mutex (Driver::mu); each stream has
//    its own mutex for its queue. Lock order: Driver::mu, then a stream's mu.
//    Stream workers never take Driver::mu except when they exit.
//  - Driver state is allocated once and never freed, so a worker abandoned at
//    process exit can never touch freed memory.

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

// cuda.h declares the whole driver API; declaring it with default visibility
// lets our definitions of those functions be exported even though the project
// builds with -fvisibility=hidden. The control functions get the same.
#pragma GCC visibility push(default)
#include <cuda.h>

#include "fake_cuda.h"
#pragma GCC visibility pop

// The reduction kernels' element arithmetic, the functions the GPU runs.
#include "reduce/element_ops.h"

#if CUDA_VERSION < 12000
#error "the CUDA stand-in needs the CUDA 12 or newer toolkit headers"
#endif

#define FAKE_API extern "C" __attribute__((visibility("default")))

namespace fakecuda {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::microseconds;

// ---------------------------------------------------------------------------
// Model constants. Values of an H100-class device, so code that sizes things
// from device attributes sees plausible numbers.

constexpr int kDriverVersion = 13000;
constexpr int kMaxDevices = 64;
constexpr size_t kVmmGranularity = size_t{2} << 20;         // 2 MiB
constexpr size_t kDeviceTotalMem = size_t{80} << 30;        // 80 GiB
constexpr int kMultiprocessors = 132;
constexpr int kStreamPriorityLeast = 0;
constexpr int kStreamPriorityGreatest = -5;
constexpr unsigned kMaxBatchMemOps = 255;  // cuda.h: "Must be less than 256"
// The name every VMM memfd carries, followed by the machine's index of the
// device (the same in every process, whatever SHOAL_FAKECUDA_VISIBLE_DEVICES says); an
// import reads it back (from /proc/self/fd) to learn which device the memory is on
// and to refuse descriptors that did not come from cuMemExportToShareableHandle.
constexpr std::string_view kVmmMemfdPrefix = "shoal-fakecuda-vmm-dev";
// How long process exit waits for stream workers before abandoning them.
constexpr milliseconds kExitJoinTimeout{2000};

std::atomic<bool> gShutdown{false};  // set at process exit: no more work runs

size_t pageSize() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// Any C++ exception becomes a CUresult before reaching the C caller.
template <class F>
CUresult guarded(F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

// ---------------------------------------------------------------------------
// Knobs (environment at the first cuInit, or the fake_cuda.h setters).

struct Knobs {
  std::atomic<int> devices{1};
  std::atomic<bool> memops{true};
  std::atomic<bool> batchMemops{true};  // cuStreamBatchMemOp (off: CUDA_ERROR_NOT_SUPPORTED, as on some platforms)
  std::atomic<bool> kernels{true};
  std::atomic<unsigned> streamDelayMs{0};
  std::atomic<bool> strictHostFn{false};
  std::atomic<bool> peerAccess{true};  // between distinct devices (cuDeviceCanAccessPeer, NVML)
  std::mutex hiddenMu;
  std::string hiddenKernel;  // cuModuleGetFunction does not find it (guarded by hiddenMu)
  std::string visibleDevices;  // SHOAL_FAKECUDA_VISIBLE_DEVICES as read at the first cuInit (set once, before use)
  bool visibleDevicesSet = false;
};

Knobs& knobs() {
  static Knobs* k = new Knobs;
  return *k;
}

// ---------------------------------------------------------------------------
// Per-function call counters and fail injection, keyed by base name.

struct ApiCounter {
  std::string name;
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> failAt{0};  // call number that fails; 0: none
};

// cuMemAlloc_v2 -> cuMemAlloc, cuMemcpyAsync_ptsz -> cuMemcpyAsync.
std::string baseName(std::string_view name) {
  for (std::string_view suffix : {"_ptsz", "_ptds"}) {
    if (name.size() > suffix.size() && name.ends_with(suffix)) name.remove_suffix(suffix.size());
  }
  size_t v = name.rfind("_v");
  if (v != std::string_view::npos && v + 2 < name.size() &&
      std::all_of(name.begin() + v + 2, name.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    name = name.substr(0, v);
  }
  return std::string(name);
}

class ApiCounters {
 public:
  // Stable reference: counters are never removed.
  ApiCounter& get(std::string_view name) {
    std::string base = baseName(name);
    std::lock_guard lk(mu_);
    auto it = byName_.find(base);
    if (it == byName_.end()) {
      auto counter = std::make_unique<ApiCounter>();
      counter->name = base;
      it = byName_.emplace(base, std::move(counter)).first;
    }
    return *it->second;
  }
  // Read-only lookup: 0 calls for a name never called.
  uint64_t calls(std::string_view name) {
    std::string base = baseName(name);
    std::lock_guard lk(mu_);
    auto it = byName_.find(base);
    return it == byName_.end() ? 0 : it->second->calls.load();
  }
  std::mutex& mutex() { return mu_; }

 private:
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<ApiCounter>, std::less<>> byName_;
};

ApiCounters& counters() {
  static ApiCounters* c = new ApiCounters;
  return *c;
}

// Function-local statics in FAKE_ENTER must not throw out of an extern "C"
// function: fall back to a shared scratch counter if allocation fails.
ApiCounter& counterFor(std::string_view name) noexcept {
  try {
    return counters().get(name);
  } catch (...) {
    static ApiCounter scratch;
    return scratch;
  }
}

// ---------------------------------------------------------------------------
// Host functions: CUDA forbids CUDA calls from inside them.

thread_local bool tInHostFn = false;
std::atomic<uint64_t> gHostFnViolations{0};

void reportHostFnViolation(const std::string& fn) {
  uint64_t n = gHostFnViolations.fetch_add(1) + 1;
  if (knobs().strictHostFn.load()) {
    std::fprintf(stderr,
                 "shoal-fakecuda: FATAL: %s called from inside a host function "
                 "(cuLaunchHostFunc); CUDA forbids CUDA calls there\n",
                 fn.c_str());
    std::abort();
  }
  constexpr uint64_t kMaxReports = 16;  // one line per call, but bounded
  if (n <= kMaxReports) {
    std::fprintf(stderr,
                 "shoal-fakecuda: warning: %s called from inside a host function "
                 "(cuLaunchHostFunc), which CUDA forbids; returning CUDA_ERROR_NOT_PERMITTED%s\n",
                 fn.c_str(), n == kMaxReports ? " (further reports suppressed)" : "");
  }
}

std::atomic<bool> gInitialized{false};

// Reads an enum a caller stored in memory as its raw value: a caller may
// store any integer there, and loading an out-of-range value through the enum
// type is undefined behaviour.
template <class E>
unsigned rawEnum(const E& e) {
  static_assert(sizeof(E) == sizeof(unsigned));
  unsigned v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// Entry checks shared by every exported CUDA function, in this order: count
// the call; refuse calls from host functions; inject a requested failure;
// refuse work after process teardown; require cuInit.
CUresult enter(ApiCounter& c, bool needsInit) {
  uint64_t n = c.calls.fetch_add(1) + 1;
  if (tInHostFn) {
    reportHostFnViolation(c.name);
    return CUDA_ERROR_NOT_PERMITTED;
  }
  uint64_t failAt = c.failAt.load();
  if (failAt != 0 && n == failAt) {
    c.failAt.compare_exchange_strong(failAt, 0);
    return CUDA_ERROR_UNKNOWN;
  }
  if (needsInit) {
    if (gShutdown.load()) return CUDA_ERROR_DEINITIALIZED;
    if (!gInitialized.load()) return CUDA_ERROR_NOT_INITIALIZED;
  }
  return CUDA_SUCCESS;
}

#define FAKE_ENTER_IMPL(name, needsInit)                                               \
  static ::fakecuda::ApiCounter& fakeCounter_ = ::fakecuda::counterFor(name);          \
  if (CUresult enterResult_ = ::fakecuda::enter(fakeCounter_, needsInit);              \
      enterResult_ != CUDA_SUCCESS)                                                    \
  return enterResult_

// Most functions need cuInit; a few (cuInit, cuDriverGetVersion,
// cuGetProcAddress, cuGetErrorString/Name) do not.
#define FAKE_ENTER(name) FAKE_ENTER_IMPL(name, true)
#define FAKE_ENTER_NOINIT(name) FAKE_ENTER_IMPL(name, false)

// ---------------------------------------------------------------------------
// Driver state.

struct Stream;

struct Context {
  int device = 0;
  uint64_t id = 0;
  int retains = 0;
  std::shared_ptr<Stream> defaultStream;  // created lazily
};

// Host-accessible view of emulated memory. Queued work holds a reference, so a
// free while work is still queued never unmaps what that work touches.
struct Backing {
  void* addr = nullptr;  // mapping to unmap at the end (nullptr: none owned)
  size_t len = 0;
  std::shared_ptr<void> owner;  // e.g. the physical allocation a mapping views
  Backing() = default;
  Backing(const Backing&) = delete;
  Backing& operator=(const Backing&) = delete;
  ~Backing() {
    if (addr != nullptr) munmap(addr, len);
  }
};

enum class MemKind { Device, Managed, PinnedHost, RegisteredHost, Mapped };

bool isDeviceKind(MemKind k) { return k == MemKind::Device || k == MemKind::Mapped; }
// Copies may not run past the end of these (the caller sees no host memory there).
bool isBoundsChecked(MemKind k) {
  return k == MemKind::Device || k == MemKind::Managed || k == MemKind::Mapped;
}

// Physical memory of cuMemCreate / cuMemImportFromShareableHandle.
struct PhysAlloc {
  int fd = -1;
  size_t size = 0;
  int device = 0;
  CUmemAllocationProp prop{};
  PhysAlloc() = default;
  PhysAlloc(const PhysAlloc&) = delete;
  PhysAlloc& operator=(const PhysAlloc&) = delete;
  ~PhysAlloc() {
    if (fd >= 0) close(fd);
  }
};

struct Allocation {
  uintptr_t base = 0;  // the address the caller uses
  size_t size = 0;     // requested size
  size_t mappedLen = 0;
  MemKind kind = MemKind::Device;
  int device = 0;
  Context* ctx = nullptr;
  char* alias = nullptr;  // where the stand-in reads and writes base..base+size
  std::shared_ptr<Backing> backing;
  unsigned hostFlags = 0;
  uint64_t bufferId = 0;
  uintptr_t rangeBase = 0;  // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR / _SIZE
  size_t rangeSize = 0;
  // Mapped (cuMemMap) only:
  uint64_t physHandle = 0;
  std::shared_ptr<PhysAlloc> phys;
  uint64_t allowedHandleTypes = 0;
  std::map<int, CUmemAccess_flags> access;  // per device ordinal
};

struct HandleEntry {
  std::shared_ptr<PhysAlloc> phys;
  int refs = 1;  // cuMemCreate/Import, plus cuMemRetainAllocationHandle calls
};

struct Op {
  uint64_t seq = 0;
  std::function<void()> run;
};

struct Graph;

struct Stream {
  Context* ctx = nullptr;
  unsigned flags = 0;
  int priority = 0;
  uint64_t id = 0;
  bool isDefault = false;

  std::mutex mu;
  std::condition_variable workCv;  // work queued, or the stream is ending
  std::condition_variable doneCv;  // an operation completed
  std::deque<Op> queue;            // front: running or next to run
  uint64_t enqueued = 0;           // seq of the last operation queued
  uint64_t completed = 0;          // seq of the last operation finished
  bool destroyRequested = false;   // cuStreamDestroy: drain, then end
  bool workerExited = false;
  std::atomic<bool> abandon{false};   // process exit: stop without draining
  std::atomic<bool> orphaned{false};  // inherited through fork(): no worker

  CUstreamCaptureStatus captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
  CUstreamCaptureMode captureMode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  uint64_t captureId = 0;
  uint64_t capturedOps = 0;
  Graph* captureGraph = nullptr;  // owned by Driver::graphs while capturing
  std::thread::id captureThread;  // the thread that began the capture

  bool stopping() const { return abandon.load(std::memory_order_relaxed) || gShutdown.load(std::memory_order_relaxed); }
};

// A recorded event point: the event is complete once the marker operation,
// queued behind everything recorded before it, has run.
struct Marker {
  std::shared_ptr<Stream> stream;
  uint64_t seq = 0;
  std::atomic<int64_t> doneNs{-1};
};

struct Event {
  unsigned flags = 0;
  std::shared_ptr<Marker> marker;  // nullptr: never recorded (complete)
};

struct ReduceKernel;
struct Function;
struct Module {
  Context* ctx = nullptr;            // current at the load: its kernels run on its streams only
  std::vector<std::string> entries;  // the kernels found in the image
  std::vector<std::unique_ptr<Function>> functions;
};
struct Function {
  Module* module = nullptr;
  std::string name;
  const ReduceKernel* reduce = nullptr;  // null: the wait kernel
};

// A CUDA user object (cuUserObjectCreate): `destroy(ptr)` runs once the
// last reference (the creator's, graphs', executable graphs') is released.
struct UserObject {
  void* ptr = nullptr;
  CUhostFn destroy = nullptr;
  unsigned refs = 0;  // guarded by Driver::mu
};

// A captured graph: the operations its capture recorded, in stream order (a
// single stream's capture is a chain), replayed by each launch of an
// executable graph made from it. The recorded operations may refer to the
// stream they were captured on, which the graph keeps alive.
struct Graph {
  uint64_t capturedOps = 0;
  std::vector<std::function<void()>> ops;
  std::vector<std::shared_ptr<Stream>> origins;
  std::map<UserObject*, unsigned> userRefs;  // references this graph owns
  bool capturing = false;                    // still being captured into
};

struct GraphExec {
  std::vector<std::function<void()>> ops;
  std::vector<std::shared_ptr<Stream>> origins;
  std::map<UserObject*, unsigned> userRefs;  // taken at instantiation
};

struct Driver {
  std::mutex mu;
  std::vector<std::unique_ptr<Context>> contexts;  // primary context per device
  // The machine's device behind each ordinal of this process
  // (SHOAL_FAKECUDA_VISIBLE_DEVICES); set at cuInit, never changed after.
  std::vector<int> physical;
  std::map<uintptr_t, Allocation> allocations;     // keyed by base address
  std::map<uintptr_t, size_t> reservations;        // cuMemAddressReserve ranges
  std::map<uint64_t, HandleEntry> handles;         // cuMem handles
  std::map<int, size_t> deviceBytesInUse;          // cuMemAlloc accounting
  std::unordered_map<Stream*, std::shared_ptr<Stream>> liveStreams;  // user handles
  std::unordered_map<Stream*, std::shared_ptr<Stream>> running;      // streams with a worker
  size_t runningWorkers = 0;
  std::condition_variable workersCv;
  std::unordered_map<Event*, std::unique_ptr<Event>> events;
  std::unordered_map<Module*, std::unique_ptr<Module>> modules;
  std::unordered_set<Function*> functions;
  std::unordered_map<Graph*, std::unique_ptr<Graph>> graphs;
  std::unordered_map<GraphExec*, std::unique_ptr<GraphExec>> graphExecs;
  std::unordered_set<UserObject*> userObjects;
  uint64_t nextId = 1;
  uint64_t nextHandle = 0x5f0000001ull;  // opaque-looking cuMem handle values

  Driver();
};

void atforkPrepare();
void atforkParent();
void atforkChild();

Driver::Driver() { pthread_atfork(atforkPrepare, atforkParent, atforkChild); }

std::atomic<Driver*> gDriver{nullptr};  // set once drv() has run

Driver& drv() {
  static Driver* d = [] {
    auto* created = new Driver;  // never freed: see the header comment
    gDriver.store(created);
    return created;
  }();
  return *d;
}

// ---------------------------------------------------------------------------
// fork(): the child has none of the parent's threads. Metadata locks are held
// across fork() so the child never inherits them mid-update; streams that
// existed are marked orphaned (no worker) and kept alive forever, because
// their mutexes/condition variables may be in a state the child cannot clean.

std::vector<std::shared_ptr<Stream>>* gForkGraveyard = nullptr;

void atforkPrepare() {
  counters().mutex().lock();
  drv().mu.lock();
}

void atforkParent() {
  drv().mu.unlock();
  counters().mutex().unlock();
}

void atforkChild() {
  Driver& d = drv();
  if (gForkGraveyard == nullptr) gForkGraveyard = new std::vector<std::shared_ptr<Stream>>;
  auto bury = [](const std::shared_ptr<Stream>& s) {
    if (!s) return;
    s->orphaned.store(true);
    gForkGraveyard->push_back(s);
  };
  for (auto& [raw, s] : d.running) bury(s);
  for (auto& [raw, s] : d.liveStreams) bury(s);
  for (auto& c : d.contexts) {
    bury(c->defaultStream);
    c->defaultStream.reset();  // the child gets a fresh default stream on demand
  }
  // A stream already destroyed may live on in an event's record point; its
  // condition variable may have had waiters in the parent, so it is kept too.
  for (auto& [raw, e] : d.events) {
    if (e->marker) bury(e->marker->stream);
  }
  d.running.clear();
  d.runningWorkers = 0;
  d.mu.unlock();
  counters().mutex().unlock();
}

// ---------------------------------------------------------------------------
// Current context: a per-thread stack whose top is current.

thread_local std::vector<Context*> tCtxStack;
thread_local CUstreamCaptureMode tCaptureMode = CU_STREAM_CAPTURE_MODE_GLOBAL;
// Captures in progress, for cuThreadExchangeStreamCaptureMode's rules: begun
// in global mode by any thread, and begun by this thread in a mode other
// than relaxed.
std::atomic<int> gGlobalCaptures{0};
thread_local int tGlobalCapturesHere = 0;
thread_local int tStrictCapturesHere = 0;
thread_local int tCapturesHere = 0;  // in any mode, relaxed included

// Whether a potentially unsafe call (allocation, free, module load,
// synchronous copy, synchronizing with or querying a stream or event: they
// may synchronize; PyTorch's watchdog met the query case) is refused on this
// thread now:
// in global mode while this thread captures, or another thread captures in
// global mode; in thread-local mode while this thread captures; never in
// relaxed mode. (The stand-in refuses the call; a real driver also
// invalidates the capture.)
void noteCaptureBegun(CUstreamCaptureMode mode) {
  if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
    gGlobalCaptures.fetch_add(1, std::memory_order_acq_rel);
    ++tGlobalCapturesHere;
  }
  if (mode != CU_STREAM_CAPTURE_MODE_RELAXED) ++tStrictCapturesHere;
  ++tCapturesHere;
}

// `here`: on the thread that began it (else only the process-wide count moves).
void noteCaptureEnded(CUstreamCaptureMode mode, bool here) {
  if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
    gGlobalCaptures.fetch_sub(1, std::memory_order_acq_rel);
    if (here) --tGlobalCapturesHere;
  }
  if (mode != CU_STREAM_CAPTURE_MODE_RELAXED && here) --tStrictCapturesHere;
  if (here) --tCapturesHere;
}


bool captureProhibitsUnsafeCalls() {
  if (tCaptureMode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  if (tStrictCapturesHere > 0) return true;
  return tCaptureMode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
         gGlobalCaptures.load(std::memory_order_acquire) - tGlobalCapturesHere > 0;
}

// Freeing memory may synchronize the device (cudaFreeHost is known to),
// which a stream being captured cannot join: refused on a thread with a
// capture of its own under way whatever its mode, as PyTorch's allocator
// never frees during a capture. (Stricter than CUDA documents: code that
// frees there is refused here.)
bool captureProhibitsFree() { return tCapturesHere > 0 || captureProhibitsUnsafeCalls(); }

Context* currentContext() { return tCtxStack.empty() ? nullptr : tCtxStack.back(); }

// Requires d.mu.
Context* contextFromHandle(Driver& d, CUcontext h) {
  for (auto& c : d.contexts) {
    if (reinterpret_cast<CUcontext>(c.get()) == h) return c.get();
  }
  return nullptr;
}

CUcontext toHandle(Context* c) { return reinterpret_cast<CUcontext>(c); }

bool validDevice(Driver& d, CUdevice dev) {
  return dev >= 0 && static_cast<size_t>(dev) < d.contexts.size();
}

// The machine's device behind a valid ordinal of this process.
int physicalOf(Driver& d, CUdevice dev) { return d.physical[static_cast<size_t>(dev)]; }

// This process's ordinal of the machine's device `physical`, or
// CU_DEVICE_INVALID where SHOAL_FAKECUDA_VISIBLE_DEVICES hides it.
CUdevice ordinalOfPhysical(Driver& d, int physical) {
  for (size_t i = 0; i < d.physical.size(); ++i)
    if (d.physical[i] == physical) return static_cast<CUdevice>(i);
  return CU_DEVICE_INVALID;
}


// ---------------------------------------------------------------------------
// Streams.

// Sleeps up to `ms`, waking early when the stream must stop.
void sleepOnStream(const Stream& s, unsigned ms) {
  const auto end = Clock::now() + milliseconds(ms);
  while (!s.stopping()) {
    auto left = end - Clock::now();
    if (left <= Clock::duration::zero()) return;
    std::this_thread::sleep_for(std::min<Clock::duration>(left, milliseconds(5)));
  }
}

// Polls `done` (acquire loads inside) with a yield-then-sleep backoff until it
// holds or the stream must stop. This is how a GPU front end waits on memory.
template <class Pred>
void pollOnStream(const Stream& s, Pred done) {
  for (unsigned i = 0; !done(); ++i) {
    if (s.stopping()) return;
    if (i < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(microseconds(i < 2000 ? 20 : 200));
    }
  }
}

void workerLoop(std::shared_ptr<Stream> s) {
  pthread_setname_np(pthread_self(), "fakecuda-strm");
  for (;;) {
    std::function<void()> run;
    uint64_t seq = 0;
    {
      std::unique_lock lk(s->mu);
      s->workCv.wait(lk, [&] { return !s->queue.empty() || s->destroyRequested || s->abandon.load(); });
      if (s->abandon.load() || s->queue.empty()) break;  // exit, or destroyed and drained
      run = std::move(s->queue.front().run);
      seq = s->queue.front().seq;
    }
    if (unsigned delay = knobs().streamDelayMs.load()) sleepOnStream(*s, delay);
    if (!s->stopping()) {
      try {
        run();
      } catch (...) {
        // Work items are noexcept by construction; a throwing host function
        // must not take the worker down with it.
      }
    }
    run = nullptr;  // release what the operation kept alive before reporting
    {
      std::lock_guard lk(s->mu);
      s->queue.pop_front();
      s->completed = seq;
    }
    s->doneCv.notify_all();
  }
  {
    std::lock_guard lk(s->mu);
    s->workerExited = true;
  }
  s->doneCv.notify_all();
  Driver& d = drv();
  {
    std::lock_guard lk(d.mu);
    if (!s->orphaned.load() && d.running.erase(s.get()) != 0) --d.runningWorkers;
  }
  d.workersCv.notify_all();
}

// Requires d.mu. Starts a stream and its worker thread.
CUresult startStreamLocked(Driver& d, Context* ctx, unsigned flags, int priority, bool isDefault,
                           std::shared_ptr<Stream>& out) {
  auto s = std::make_shared<Stream>();
  s->ctx = ctx;
  s->flags = flags;
  s->priority = priority;
  s->isDefault = isDefault;
  s->id = d.nextId++;
  try {
    std::thread(workerLoop, s).detach();
  } catch (const std::system_error&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  d.running.emplace(s.get(), s);
  ++d.runningWorkers;
  out = std::move(s);
  return CUDA_SUCCESS;
}

// Requires d.mu.
CUresult defaultStreamLocked(Driver& d, Context& ctx, std::shared_ptr<Stream>& out) {
  if (!ctx.defaultStream) {
    CUresult r = startStreamLocked(d, &ctx, 0, 0, true, ctx.defaultStream);
    if (r != CUDA_SUCCESS) return r;
  }
  out = ctx.defaultStream;
  return CUDA_SUCCESS;
}

bool isDefaultStreamHandle(CUstream h) {
  return h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

// Requires d.mu. 0 / CU_STREAM_LEGACY / CU_STREAM_PER_THREAD name the current
// context's default stream.
CUresult resolveStreamLocked(Driver& d, CUstream h, std::shared_ptr<Stream>& out) {
  if (isDefaultStreamHandle(h)) {
    Context* c = currentContext();
    if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    return defaultStreamLocked(d, *c, out);
  }
  auto it = d.liveStreams.find(reinterpret_cast<Stream*>(h));
  if (it == d.liveStreams.end() || it->second->orphaned.load()) return CUDA_ERROR_INVALID_HANDLE;
  out = it->second;
  return CUDA_SUCCESS;
}

// Appends `run` to the stream (or, while it is capturing, records it in the
// graph being captured). *seqOut: the operation's sequence number, 0 when
// captured.
CUresult enqueue(Stream& s, std::function<void()> run, uint64_t* seqOut = nullptr) {
  if (seqOut) *seqOut = 0;
  if (s.orphaned.load()) return CUDA_ERROR_INVALID_HANDLE;
  {
    std::lock_guard lk(s.mu);
    if (gShutdown.load() || s.abandon.load()) return CUDA_ERROR_DEINITIALIZED;
    if (s.destroyRequested) return CUDA_ERROR_INVALID_HANDLE;
    if (s.captureStatus == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
      ++s.capturedOps;
      if (s.captureGraph != nullptr) s.captureGraph->ops.push_back(std::move(run));
      return CUDA_SUCCESS;
    }
    uint64_t seq = ++s.enqueued;
    s.queue.push_back(Op{seq, std::move(run)});
    if (seqOut) *seqOut = seq;
  }
  s.workCv.notify_one();
  return CUDA_SUCCESS;
}

// Blocks the caller until operation `seq` of `s` has run.
CUresult waitForSeq(Stream& s, uint64_t seq) {
  if (s.orphaned.load()) return CUDA_ERROR_INVALID_HANDLE;
  std::unique_lock lk(s.mu);
  while (s.completed < seq) {
    if (s.stopping() || s.workerExited) return CUDA_ERROR_DEINITIALIZED;
    s.doneCv.wait_for(lk, milliseconds(20));
  }
  return CUDA_SUCCESS;
}

// Blocks `waiter`'s worker until operation `seq` of `other` has run.
void waitOnOtherStream(const Stream& waiter, Stream& other, uint64_t seq) {
  if (other.orphaned.load()) return;
  std::unique_lock lk(other.mu);
  while (other.completed < seq && !other.workerExited) {
    if (waiter.stopping() || other.stopping()) return;
    other.doneCv.wait_for(lk, milliseconds(20));
  }
}

// cuStreamSynchronize: everything queued so far.
CUresult synchronizeStream(Stream& s) {
  uint64_t target;
  {
    std::lock_guard lk(s.mu);
    if (s.captureStatus != CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    target = s.enqueued;
  }
  return waitForSeq(s, target);
}

// ---------------------------------------------------------------------------
// Memory registry and address translation.

// Requires d.mu. The registered range containing addr, if any.
Allocation* findAllocationLocked(Driver& d, uintptr_t addr) {
  auto it = d.allocations.upper_bound(addr);
  if (it == d.allocations.begin()) return nullptr;
  --it;
  Allocation& a = it->second;
  return addr - a.base < std::max<size_t>(a.size, 1) ? &a : nullptr;
}

// Requires d.mu.
bool inReservationLocked(Driver& d, uintptr_t addr, uintptr_t* base = nullptr, size_t* size = nullptr) {
  auto it = d.reservations.upper_bound(addr);
  if (it == d.reservations.begin()) return false;
  --it;
  if (addr - it->first >= it->second) return false;
  if (base) *base = it->first;
  if (size) *size = it->second;
  return true;
}

// Where emulated work reads or writes a caller's address range.
struct View {
  char* p = nullptr;
  std::shared_ptr<Backing> keep;  // keeps the mapping alive while work is queued
};

// Requires d.mu. Translates [addr, addr+bytes) for work done on behalf of
// `accessDevice` (-1: do not check cuMemSetAccess). Registered memory goes
// through its alias; any other address is taken as ordinary host memory.
CUresult viewLocked(Driver& d, CUdeviceptr addr, size_t bytes, int accessDevice, bool write, View& out) {
  const uintptr_t a = static_cast<uintptr_t>(addr);
  if (a == 0 || bytes > UINTPTR_MAX - a) return CUDA_ERROR_INVALID_VALUE;
  if (Allocation* al = findAllocationLocked(d, a)) {
    if (isBoundsChecked(al->kind) && a + bytes > al->base + al->size) return CUDA_ERROR_INVALID_VALUE;
    if (al->kind == MemKind::Mapped && accessDevice >= 0) {
      auto it = al->access.find(accessDevice);
      CUmemAccess_flags f = it == al->access.end() ? CU_MEM_ACCESS_FLAGS_PROT_NONE : it->second;
      if (f == CU_MEM_ACCESS_FLAGS_PROT_NONE || (write && f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)) {
        return CUDA_ERROR_ILLEGAL_ADDRESS;  // cuMemSetAccess was not called for this device
      }
    }
    out.p = al->alias + (a - al->base);
    out.keep = al->backing;
    return CUDA_SUCCESS;
  }
  // Plain host memory must not run into device memory: its host view faults.
  auto next = d.allocations.upper_bound(a);
  if (bytes > 0 && next != d.allocations.end() && next->first < a + bytes && isDeviceKind(next->second.kind)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Reserved but unmapped virtual addresses hold nothing.
  if (inReservationLocked(d, a)) return CUDA_ERROR_INVALID_VALUE;
  out.p = reinterpret_cast<char*>(a);
  return CUDA_SUCCESS;
}

// Requires d.mu.
void addAllocationLocked(Driver& d, Allocation a) {
  a.bufferId = d.nextId++;
  if (a.rangeSize == 0) {
    a.rangeBase = a.base;
    a.rangeSize = a.size;
  }
  uintptr_t base = a.base;
  d.allocations.insert_or_assign(base, std::move(a));
}

// Maps a fresh memfd twice: PROT_NONE where the caller looks, read/write for
// the stand-in. Returns false (nothing mapped) on failure.
bool mapDeviceMemory(size_t len, void** user, void** alias) {
  int fd = memfd_create("shoal-fakecuda-device", MFD_CLOEXEC);
  if (fd < 0) return false;
  bool ok = false;
  if (ftruncate(fd, static_cast<off_t>(len)) == 0) {
    void* u = mmap(nullptr, len, PROT_NONE, MAP_SHARED, fd, 0);
    if (u != MAP_FAILED) {
      void* a = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (a != MAP_FAILED) {
        *user = u;
        *alias = a;
        ok = true;
      } else {
        munmap(u, len);
      }
    }
  }
  close(fd);  // the mappings keep the memory
  return ok;
}

void* mapHostMemory(size_t len) {
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Requires d.mu. cuMemAlloc / cuMemAllocAsync.
CUresult allocDeviceLocked(Driver& d, Context* ctx, size_t bytes, CUdeviceptr* dptr) {
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  size_t& inUse = d.deviceBytesInUse[ctx->device];
  if (bytes > kDeviceTotalMem - inUse) return CUDA_ERROR_OUT_OF_MEMORY;
  const size_t len = roundUp(bytes, pageSize());
  void* user = nullptr;
  void* alias = nullptr;
  if (!mapDeviceMemory(len, &user, &alias)) return CUDA_ERROR_OUT_OF_MEMORY;
  auto backing = std::make_shared<Backing>();
  backing->addr = alias;
  backing->len = len;
  Allocation a;
  a.base = reinterpret_cast<uintptr_t>(user);
  a.size = bytes;
  a.mappedLen = len;
  a.kind = MemKind::Device;
  a.device = ctx->device;
  a.ctx = ctx;
  a.alias = static_cast<char*>(alias);
  a.backing = std::move(backing);
  addAllocationLocked(d, std::move(a));
  inUse += bytes;
  *dptr = reinterpret_cast<uintptr_t>(user);
  return CUDA_SUCCESS;
}

// Requires d.mu. cuMemFree / cuMemFreeAsync: device or managed memory, at its base.
CUresult freeDeviceLocked(Driver& d, CUdeviceptr dptr) {
  auto it = d.allocations.find(static_cast<uintptr_t>(dptr));
  if (it == d.allocations.end() ||
      (it->second.kind != MemKind::Device && it->second.kind != MemKind::Managed)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Allocation& a = it->second;
  if (a.kind == MemKind::Device) {
    // The PROT_NONE view goes now; the alias goes with the last queued user.
    munmap(reinterpret_cast<void*>(a.base), a.mappedLen);
    d.deviceBytesInUse[a.device] -= a.size;
  }
  d.allocations.erase(it);
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------
// Stream memory operations and the wait kernel.

template <class T>
bool waitSatisfied(T current, T value, unsigned type) {
  using S = std::make_signed_t<T>;
  switch (type) {
    case CU_STREAM_WAIT_VALUE_GEQ:
      return static_cast<S>(current - value) >= 0;  // cyclic, as cuda.h documents
    case CU_STREAM_WAIT_VALUE_EQ:
      return current == value;
    case CU_STREAM_WAIT_VALUE_AND:
      return (current & value) != 0;
    case CU_STREAM_WAIT_VALUE_NOR:
      return static_cast<T>(~(current | value)) != 0;
    default:
      return true;
  }
}

constexpr unsigned kWaitTypeMask = 0x3;

bool validWaitFlags(unsigned flags) {
  return (flags & ~(kWaitTypeMask | CU_STREAM_WAIT_VALUE_FLUSH)) == 0;
}

// One validated memory operation, ready to run on a worker.
struct MemOpStep {
  enum Kind { Wait32, Wait64, Write32, Write64, Fence } kind = Fence;
  View view;
  uint64_t value = 0;
  unsigned waitType = 0;
};

void runMemOp(const Stream& s, const MemOpStep& op) {
  switch (op.kind) {
    case MemOpStep::Wait32: {
      std::atomic_ref<uint32_t> word(*reinterpret_cast<uint32_t*>(op.view.p));
      const uint32_t v = static_cast<uint32_t>(op.value);
      pollOnStream(s, [&] { return waitSatisfied<uint32_t>(word.load(std::memory_order_acquire), v, op.waitType); });
      break;
    }
    case MemOpStep::Wait64: {
      std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(op.view.p));
      pollOnStream(s, [&] { return waitSatisfied<uint64_t>(word.load(std::memory_order_acquire), op.value, op.waitType); });
      break;
    }
    case MemOpStep::Write32:
      // Runs after every earlier operation of the stream on this same thread,
      // so a release store publishes their effects to whoever acquires it.
      std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(op.view.p))
          .store(static_cast<uint32_t>(op.value), std::memory_order_release);
      break;
    case MemOpStep::Write64:
      std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(op.view.p)).store(op.value, std::memory_order_release);
      break;
    case MemOpStep::Fence: {
      // Barrier / flush: the worker already runs in order; a seq_cst RMW
      // (rather than a bare fence, which ThreadSanitizer cannot model) makes
      // earlier writes visible before later ones.
      static std::atomic<unsigned> fence{0};
      fence.fetch_add(1, std::memory_order_seq_cst);
      break;
    }
  }
}

// Validates and enqueues a list of memory operations as one stream operation.
// `prepare` fills the steps; it runs under d.mu with the stream's device.
template <class Prepare>
CUresult enqueueMemOps(CUstream h, Prepare prepare) {
  if (!knobs().memops.load()) return CUDA_ERROR_NOT_SUPPORTED;
  Driver& d = drv();
  std::shared_ptr<Stream> s;
  std::vector<MemOpStep> steps;
  {
    std::lock_guard lk(d.mu);
    if (CUresult r = resolveStreamLocked(d, h, s); r != CUDA_SUCCESS) return r;
    if (CUresult r = prepare(d, s->ctx->device, steps); r != CUDA_SUCCESS) return r;
  }
  Stream* raw = s.get();
  return enqueue(*s, [raw, steps = std::move(steps)] {
    for (const MemOpStep& op : steps) runMemOp(*raw, op);
  });
}

// Requires d.mu.
CUresult prepareWait(Driver& d, int device, CUdeviceptr addr, uint64_t value, unsigned flags, bool is64,
                     std::vector<MemOpStep>& steps) {
  if (!validWaitFlags(flags)) return CUDA_ERROR_INVALID_VALUE;
  const size_t width = is64 ? 8 : 4;
  if (addr % width != 0) return CUDA_ERROR_INVALID_VALUE;
  MemOpStep op;
  op.kind = is64 ? MemOpStep::Wait64 : MemOpStep::Wait32;
  op.value = is64 ? value : static_cast<uint32_t>(value);
  op.waitType = flags & kWaitTypeMask;
  if (CUresult r = viewLocked(d, addr, width, device, false, op.view); r != CUDA_SUCCESS) return r;
  steps.push_back(std::move(op));
  return CUDA_SUCCESS;
}

// Requires d.mu. The v2 API takes no write flags (NO_MEMORY_BARRIER is v1 only).
CUresult prepareWrite(Driver& d, int device, CUdeviceptr addr, uint64_t value, unsigned flags, bool is64,
                      std::vector<MemOpStep>& steps) {
  if (flags != CU_STREAM_WRITE_VALUE_DEFAULT) return CUDA_ERROR_INVALID_VALUE;
  const size_t width = is64 ? 8 : 4;
  if (addr % width != 0) return CUDA_ERROR_INVALID_VALUE;
  MemOpStep op;
  op.kind = is64 ? MemOpStep::Write64 : MemOpStep::Write32;
  op.value = is64 ? value : static_cast<uint32_t>(value);
  if (CUresult r = viewLocked(d, addr, width, device, true, op.view); r != CUDA_SUCCESS) return r;
  steps.push_back(std::move(op));
  return CUDA_SUCCESS;
}

constexpr std::string_view kWaitKernelName = "shoal_wait_u64";

// ---------------------------------------------------------------------------
// The reduction kernels (src/cuda/reduce_kernels.cu), by name. Each runs
// dst[i] = op(a[i], b[i]) with element_ops.h's applyElement, the function the
// GPU kernel runs per element, over the whole range whatever the grid (the
// kernels loop grid-stride). Parameters, as the kernels':
//   (void* dst, const void* a, const void* b, unsigned long long count,
//    const void* scalar, unsigned long long scalarBits)

using ReduceRunner = void (*)(char* dst, const char* a, const char* b, uint64_t count,
                              const char* scalar, uint64_t scalarBits);
struct ReduceKernel {
  std::string name;
  size_t elementSize = 0;
  bool integerAvg = false;  // divides by scalarBits
  ReduceRunner run = nullptr;
};
constexpr int kReduceParams = 6;
constexpr unsigned kReduceMaxThreads = shoal::reduce::kReduceKernelThreads;  // __launch_bounds__

template <class Ty, shoal::reduce::ElementOp kOp>
void runReduce(char* dst, const char* a, const char* b, uint64_t count, const char* scalar,
               uint64_t scalarBits) {
  using S = typename Ty::S;
  using shoal::reduce::ElementOp;
  shoal::reduce::ElementScalar<S> s;
  if constexpr (kOp == ElementOp::kPreMulSum || (kOp == ElementOp::kAvg && Ty::kFloating)) {
    // Read when the kernel runs (in stream order), from device memory or the
    // low bytes of scalarBits.
    std::memcpy(&s.value, scalar != nullptr ? scalar : reinterpret_cast<const char*>(&scalarBits),
                sizeof(S));
  }
  if constexpr (kOp == ElementOp::kAvg && !Ty::kFloating) s.divisor = scalarBits;
  for (uint64_t i = 0; i < count; ++i) {
    S x, y;
    std::memcpy(&x, a + i * sizeof(S), sizeof(S));
    std::memcpy(&y, b + i * sizeof(S), sizeof(S));
    const S r = shoal::reduce::applyElement<Ty, kOp>(x, y, s);
    std::memcpy(dst + i * sizeof(S), &r, sizeof(S));
  }
}

template <class Ty>
void addReduceKernels(std::vector<ReduceKernel>& out, const char* typeName) {
  using shoal::reduce::ElementOp;
  const ReduceRunner runners[shoal::reduce::kNumElementOps] = {
      runReduce<Ty, ElementOp::kSum>,       runReduce<Ty, ElementOp::kProd>,
      runReduce<Ty, ElementOp::kMax>,       runReduce<Ty, ElementOp::kMin>,
      runReduce<Ty, ElementOp::kPreMulSum>, runReduce<Ty, ElementOp::kAvg>};
  for (int op = 0; op < shoal::reduce::kNumElementOps; ++op) {
    ReduceKernel k;
    k.name = std::string(shoal::reduce::kReduceKernelPrefix) + shoal::reduce::kElementOpNames[op] +
             "_" + typeName;
    k.elementSize = sizeof(typename Ty::S);
    k.integerAvg = op == int(ElementOp::kAvg) && !Ty::kFloating;
    k.run = runners[op];
    out.push_back(std::move(k));
  }
}

const std::vector<ReduceKernel>& reduceKernels() {
  static const std::vector<ReduceKernel>* kernels = [] {
    auto* v = new std::vector<ReduceKernel>;
#define FAKE_ADD_REDUCE_TYPE(name, dtype, Ty) addReduceKernels<Ty>(*v, #name);
    SHOAL_ELEMENT_TYPES(FAKE_ADD_REDUCE_TYPE)
#undef FAKE_ADD_REDUCE_TYPE
    return v;
  }();
  return *kernels;
}

const ReduceKernel* findReduceKernel(std::string_view name) {
  for (const ReduceKernel& k : reduceKernels())
    if (k.name == name) return &k;
  return nullptr;
}

bool runnableKernel(std::string_view name) {
  return name == kWaitKernelName || findReduceKernel(name) != nullptr;
}

// A fatbin image (nvcc -fatbin): its header gives its length. Set when the
// image starts with the fatbin magic.
bool fatbinSize(const void* image, size_t* size) {
  constexpr uint32_t kFatbinMagic = 0xBA55ED50u;
  uint32_t magic = 0;
  uint16_t headerSize = 0;
  uint64_t bodySize = 0;
  // A PTX string may be shorter than the header: the magic has no NUL byte.
  if (strnlen(static_cast<const char*>(image), 4) < 4) return false;
  std::memcpy(&magic, image, 4);
  if (magic != kFatbinMagic) return false;
  std::memcpy(&headerSize, static_cast<const char*>(image) + 6, 2);
  std::memcpy(&bodySize, static_cast<const char*>(image) + 8, 8);
  *size = headerSize + bodySize;
  return true;
}

// The kernels the stand-in can run that an uncompressed fatbin holds: named
// by a PTX `.entry name(` or a NUL-delimited ELF symbol name. (A compressed
// fatbin shows neither and holds none here.)
std::vector<std::string> fatbinEntries(const void* image, size_t size) {
  const std::string_view bytes(static_cast<const char*>(image), size);
  std::vector<std::string> names;
  auto holds = [&](std::string_view name) {
    const std::string ptx = ".entry " + std::string(name) + "(";
    const std::string elf = std::string(1, '\0') + std::string(name) + std::string(1, '\0');
    return bytes.find(ptx) != std::string_view::npos || bytes.find(elf) != std::string_view::npos;
  };
  if (holds(kWaitKernelName)) names.emplace_back(kWaitKernelName);
  for (const ReduceKernel& k : reduceKernels())
    if (holds(k.name)) names.push_back(k.name);
  return names;
}

// The .entry names a NUL-terminated PTX image declares.
std::vector<std::string> ptxEntries(const char* image) {
  std::vector<std::string> names;
  constexpr std::string_view kEntry = ".entry";
  std::string_view text(image);
  for (size_t at = text.find(kEntry); at != std::string_view::npos; at = text.find(kEntry, at + 1)) {
    size_t i = at + kEntry.size();
    if (i >= text.size() || !std::isspace(static_cast<unsigned char>(text[i]))) continue;
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t start = i;
    while (i < text.size() && (std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == '_' || text[i] == '$')) ++i;
    if (i > start) names.emplace_back(text.substr(start, i - start));
  }
  return names;
}

// ---------------------------------------------------------------------------
// Copies and memsets.

// Resolves the stream an operation goes to: `h` for async calls, the current
// context's default stream for synchronous ones. Requires d.mu.
CUresult targetStreamLocked(Driver& d, CUstream h, bool sync, std::shared_ptr<Stream>& s) {
  if (!sync) return resolveStreamLocked(d, h, s);
  Context* c = currentContext();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return defaultStreamLocked(d, *c, s);
}

// Synchronous calls are ordered after earlier default-stream work and return
// once done, as the legacy default stream behaves.
CUresult submit(Stream& s, std::function<void()> run, bool sync) {
  uint64_t seq = 0;
  if (CUresult r = enqueue(s, std::move(run), &seq); r != CUDA_SUCCESS) return r;
  return sync && seq != 0 ? waitForSeq(s, seq) : CUDA_SUCCESS;
}

CUresult copyImpl(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream h, bool sync) {
  Driver& d = drv();
  std::shared_ptr<Stream> s;
  View to, from;
  {
    std::lock_guard lk(d.mu);
    if (CUresult r = targetStreamLocked(d, h, sync, s); r != CUDA_SUCCESS) return r;
    if (bytes == 0) return CUDA_SUCCESS;
    const int dev = s->ctx->device;
    if (CUresult r = viewLocked(d, dst, bytes, dev, true, to); r != CUDA_SUCCESS) return r;
    if (CUresult r = viewLocked(d, src, bytes, dev, false, from); r != CUDA_SUCCESS) return r;
  }
  return submit(*s, [to = std::move(to), from = std::move(from), bytes] {
    // An aligned 8-byte copy is one store, as a GPU's is: a word the host
    // polls (a stream's "ready" written by a copy) is never seen torn.
    if (bytes == 8 && reinterpret_cast<uintptr_t>(to.p) % 8 == 0 && reinterpret_cast<uintptr_t>(from.p) % 8 == 0) {
      const uint64_t v = std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(from.p)).load(std::memory_order_acquire);
      std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(to.p)).store(v, std::memory_order_release);
      return;
    }
    std::memmove(to.p, from.p, bytes);
  }, sync);
}

CUresult memsetImpl(CUdeviceptr dst, uint32_t value, size_t count, size_t width, CUstream h, bool sync) {
  if (dst % width != 0) return CUDA_ERROR_INVALID_VALUE;
  if (count > SIZE_MAX / width) return CUDA_ERROR_INVALID_VALUE;
  const size_t bytes = count * width;
  Driver& d = drv();
  std::shared_ptr<Stream> s;
  View to;
  {
    std::lock_guard lk(d.mu);
    if (CUresult r = targetStreamLocked(d, h, sync, s); r != CUDA_SUCCESS) return r;
    if (bytes == 0) return CUDA_SUCCESS;
    if (CUresult r = viewLocked(d, dst, bytes, s->ctx->device, true, to); r != CUDA_SUCCESS) return r;
  }
  return submit(*s, [to = std::move(to), value, count, width] {
    if (width == 1) {
      std::memset(to.p, static_cast<int>(value & 0xff), count);
    } else {
      for (size_t i = 0; i < count; ++i) std::memcpy(to.p + i * width, &value, width);
    }
  }, sync);
}

// ---------------------------------------------------------------------------
// Environment knobs, read once, at the first cuInit.

bool envFlag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

bool parseUnsigned(const char* text, unsigned long max, unsigned long* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long v = std::strtoul(text, &end, 10);
  if (errno != 0 || *end != '\0' || v > max || text[0] == '-') return false;
  *out = v;
  return true;
}

// SHOAL_FAKECUDA_VISIBLE_DEVICES, read as CUDA reads CUDA_VISIBLE_DEVICES
// (indices only): the listed devices of the machine's `count`, in that
// order, up to the first entry that is not one (out of range, repeated or
// not a number); unset, all of them. A variable of its own, so that a
// CUDA_VISIBLE_DEVICES the tests' shell has (a GPU machine) changes nothing.
std::vector<int> visibleDevices(int count) {
  std::vector<int> out;
  Knobs& k = knobs();
  if (!k.visibleDevicesSet) {
    for (int i = 0; i < count; ++i) out.push_back(i);
    return out;
  }
  std::string_view rest = k.visibleDevices;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    unsigned long v = 0;
    if (!parseUnsigned(item.c_str(), static_cast<unsigned long>(count > 0 ? count - 1 : 0), &v) || count == 0 ||
        std::find(out.begin(), out.end(), static_cast<int>(v)) != out.end())
      break;
    out.push_back(static_cast<int>(v));
  }
  return out;
}

void loadEnvironment() {
  Knobs& k = knobs();
  unsigned long v = 0;
  if (const char* devs = std::getenv("SHOAL_FAKECUDA_DEVICES")) {
    if (parseUnsigned(devs, kMaxDevices, &v)) {
      k.devices.store(static_cast<int>(v));
    } else {
      std::fprintf(stderr, "shoal-fakecuda: ignoring SHOAL_FAKECUDA_DEVICES=%s (want 0..%d)\n", devs, kMaxDevices);
    }
  }
  if (const char* visible = std::getenv("SHOAL_FAKECUDA_VISIBLE_DEVICES")) {
    k.visibleDevices = visible;
    k.visibleDevicesSet = true;
  }
  if (envFlag("SHOAL_FAKECUDA_NO_MEMOPS")) k.memops.store(false);
  if (envFlag("SHOAL_FAKECUDA_NO_BATCH_MEMOPS")) k.batchMemops.store(false);
  if (envFlag("SHOAL_FAKECUDA_NO_KERNELS")) k.kernels.store(false);
  if (envFlag("SHOAL_FAKECUDA_STRICT_HOSTFN")) k.strictHostFn.store(true);
  if (envFlag("SHOAL_FAKECUDA_NO_PEER_ACCESS")) k.peerAccess.store(false);
  if (const char* hidden = std::getenv("SHOAL_FAKECUDA_HIDE_KERNEL")) {
    std::lock_guard lk(k.hiddenMu);
    k.hiddenKernel = hidden;
  }
  if (const char* delay = std::getenv("SHOAL_FAKECUDA_STREAM_DELAY_MS")) {
    if (parseUnsigned(delay, 3600u * 1000u, &v)) {
      k.streamDelayMs.store(static_cast<unsigned>(v));
    } else {
      std::fprintf(stderr, "shoal-fakecuda: ignoring SHOAL_FAKECUDA_STREAM_DELAY_MS=%s\n", delay);
    }
  }
  if (const char* fail = std::getenv("SHOAL_FAKECUDA_FAIL")) {
    // name:n[,name:n...]; n counts calls from the start of the process.
    std::string_view rest(fail);
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      size_t colon = item.rfind(':');
      std::string count(colon == std::string_view::npos ? std::string_view() : item.substr(colon + 1));
      if (colon == 0 || colon == std::string_view::npos || !parseUnsigned(count.c_str(), ULONG_MAX, &v) || v == 0) {
        std::fprintf(stderr, "shoal-fakecuda: ignoring SHOAL_FAKECUDA_FAIL item '%.*s' (want name:n, n >= 1)\n",
                     static_cast<int>(item.size()), item.data());
        continue;
      }
      counterFor(item.substr(0, colon)).failAt.store(v);
    }
  }
}

std::once_flag gEnvOnce;

// ---------------------------------------------------------------------------
// Process exit: stop the workers so none runs while the process tears down.

void shutdownStreams() {
  gShutdown.store(true);
  Driver* existing = gDriver.load();
  if (existing == nullptr) return;  // CUDA never used: nothing to stop
  Driver& d = *existing;
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard lk(d.mu);
    for (auto& [raw, s] : d.running) streams.push_back(s);
  }
  for (auto& s : streams) {
    if (s->orphaned.load()) continue;
    {
      std::lock_guard lk(s->mu);
      s->abandon.store(true);
    }
    s->workCv.notify_all();
    s->doneCv.notify_all();
  }
  // A worker stuck in a host function cannot be stopped; it is abandoned, and
  // since driver state is never freed it cannot touch freed memory.
  std::unique_lock lk(d.mu);
  d.workersCv.wait_for(lk, kExitJoinTimeout, [&] { return d.runningWorkers == 0; });
}

struct ExitGuard {
  ~ExitGuard() { shutdownStreams(); }
} gExitGuard;

// ---------------------------------------------------------------------------
// Device identity.

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The UUID of the machine's device `physical`, the same in every process
// whatever its ordinal there: two processes on one device see the same GPU,
// as they would on one machine.
CUuuid deviceUuid(int physical) {
  CUuuid u{};
  uint64_t hi = mix64(0x73686f616c000000ull + static_cast<uint64_t>(physical));
  uint64_t lo = mix64(hi);
  std::memcpy(u.bytes, &hi, 8);
  std::memcpy(u.bytes + 8, &lo, 8);
  u.bytes[6] = static_cast<char>((u.bytes[6] & 0x0f) | 0x40);  // RFC 4122 version 4 shape
  u.bytes[8] = static_cast<char>((u.bytes[8] & 0x3f) | 0x80);
  return u;
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

// ===========================================================================
// Initialisation, version, errors.

FAKE_API CUresult cuInit(unsigned int Flags) {
  // Knobs come from the environment before anything else, so that
  // SHOAL_FAKECUDA_FAIL can target this very call.
  try {
    std::call_once(gEnvOnce, loadEnvironment);
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  FAKE_ENTER_NOINIT("cuInit");
  return guarded([&]() -> CUresult {
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (gShutdown.load()) return CUDA_ERROR_DEINITIALIZED;
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    if (gInitialized.load()) return CUDA_SUCCESS;
    d.physical = visibleDevices(knobs().devices.load());
    const int n = static_cast<int>(d.physical.size());
    if (n <= 0) return CUDA_ERROR_NO_DEVICE;
    for (int i = 0; i < n; ++i) {
      auto c = std::make_unique<Context>();
      c->device = i;
      c->id = d.nextId++;
      d.contexts.push_back(std::move(c));
    }
    gInitialized.store(true);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuDriverGetVersion(int* driverVersion) {
  FAKE_ENTER_NOINIT("cuDriverGetVersion");
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = kDriverVersion;
  return CUDA_SUCCESS;
}

namespace fakecuda {
namespace {

struct ErrorText {
  CUresult code;
  const char* name;
  const char* description;  // nullptr: derived from the name
};

#define FAKE_ERR(code, text) {code, #code, text}
constexpr ErrorText kErrors[] = {
    FAKE_ERR(CUDA_SUCCESS, "no error"),
    FAKE_ERR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    FAKE_ERR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    FAKE_ERR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    FAKE_ERR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    FAKE_ERR(CUDA_ERROR_PROFILER_DISABLED, nullptr),
    FAKE_ERR(CUDA_ERROR_PROFILER_NOT_INITIALIZED, nullptr),
    FAKE_ERR(CUDA_ERROR_PROFILER_ALREADY_STARTED, nullptr),
    FAKE_ERR(CUDA_ERROR_PROFILER_ALREADY_STOPPED, nullptr),
    FAKE_ERR(CUDA_ERROR_STUB_LIBRARY, nullptr),
    FAKE_ERR(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, nullptr),
    FAKE_ERR(CUDA_ERROR_DEVICE_UNAVAILABLE, nullptr),
    FAKE_ERR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    FAKE_ERR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    FAKE_ERR(CUDA_ERROR_DEVICE_NOT_LICENSED, nullptr),
    FAKE_ERR(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    FAKE_ERR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    FAKE_ERR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, nullptr),
    FAKE_ERR(CUDA_ERROR_MAP_FAILED, nullptr),
    FAKE_ERR(CUDA_ERROR_UNMAP_FAILED, nullptr),
    FAKE_ERR(CUDA_ERROR_ARRAY_IS_MAPPED, nullptr),
    FAKE_ERR(CUDA_ERROR_ALREADY_MAPPED, nullptr),
    FAKE_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, nullptr),
    FAKE_ERR(CUDA_ERROR_ALREADY_ACQUIRED, nullptr),
    FAKE_ERR(CUDA_ERROR_NOT_MAPPED, nullptr),
    FAKE_ERR(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, nullptr),
    FAKE_ERR(CUDA_ERROR_NOT_MAPPED_AS_POINTER, nullptr),
    FAKE_ERR(CUDA_ERROR_ECC_UNCORRECTABLE, nullptr),
    FAKE_ERR(CUDA_ERROR_UNSUPPORTED_LIMIT, nullptr),
    FAKE_ERR(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, nullptr),
    FAKE_ERR(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, nullptr),
    FAKE_ERR(CUDA_ERROR_INVALID_PTX, nullptr),
    FAKE_ERR(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, nullptr),
    FAKE_ERR(CUDA_ERROR_NVLINK_UNCORRECTABLE, nullptr),
    FAKE_ERR(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, nullptr),
    FAKE_ERR(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, nullptr),
    FAKE_ERR(CUDA_ERROR_JIT_COMPILATION_DISABLED, nullptr),
    FAKE_ERR(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, nullptr),
    FAKE_ERR(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, nullptr),
    FAKE_ERR(CUDA_ERROR_CONTAINED, nullptr),
    FAKE_ERR(CUDA_ERROR_INVALID_SOURCE, nullptr),
    FAKE_ERR(CUDA_ERROR_FILE_NOT_FOUND, nullptr),
    FAKE_ERR(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, nullptr),
    FAKE_ERR(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, nullptr),
    FAKE_ERR(CUDA_ERROR_OPERATING_SYSTEM, nullptr),
    FAKE_ERR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    FAKE_ERR(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    FAKE_ERR(CUDA_ERROR_LOSSY_QUERY, nullptr),
    FAKE_ERR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    FAKE_ERR(CUDA_ERROR_NOT_READY, "device not ready"),
    FAKE_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    FAKE_ERR(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, nullptr),
    FAKE_ERR(CUDA_ERROR_LAUNCH_TIMEOUT, nullptr),
    FAKE_ERR(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, nullptr),
    FAKE_ERR(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, nullptr),
    FAKE_ERR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, nullptr),
    FAKE_ERR(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, nullptr),
    FAKE_ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED, nullptr),
    FAKE_ERR(CUDA_ERROR_ASSERT, nullptr),
    FAKE_ERR(CUDA_ERROR_TOO_MANY_PEERS, nullptr),
    FAKE_ERR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped"),
    FAKE_ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region"),
    FAKE_ERR(CUDA_ERROR_HARDWARE_STACK_ERROR, nullptr),
    FAKE_ERR(CUDA_ERROR_ILLEGAL_INSTRUCTION, nullptr),
    FAKE_ERR(CUDA_ERROR_MISALIGNED_ADDRESS, nullptr),
    FAKE_ERR(CUDA_ERROR_INVALID_ADDRESS_SPACE, nullptr),
    FAKE_ERR(CUDA_ERROR_INVALID_PC, nullptr),
    FAKE_ERR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    FAKE_ERR(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, nullptr),
    FAKE_ERR(CUDA_ERROR_TENSOR_MEMORY_LEAK, nullptr),
    FAKE_ERR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    FAKE_ERR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    FAKE_ERR(CUDA_ERROR_SYSTEM_NOT_READY, nullptr),
    FAKE_ERR(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, nullptr),
    FAKE_ERR(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, nullptr),
    FAKE_ERR(CUDA_ERROR_MPS_CONNECTION_FAILED, nullptr),
    FAKE_ERR(CUDA_ERROR_MPS_RPC_FAILURE, nullptr),
    FAKE_ERR(CUDA_ERROR_MPS_SERVER_NOT_READY, nullptr),
    FAKE_ERR(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, nullptr),
    FAKE_ERR(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, nullptr),
    FAKE_ERR(CUDA_ERROR_MPS_CLIENT_TERMINATED, nullptr),
    FAKE_ERR(CUDA_ERROR_CDP_NOT_SUPPORTED, nullptr),
    FAKE_ERR(CUDA_ERROR_CDP_VERSION_MISMATCH, nullptr),
    FAKE_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"),
    FAKE_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, nullptr),
    FAKE_ERR(CUDA_ERROR_STREAM_CAPTURE_MERGE, nullptr),
    FAKE_ERR(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, nullptr),
    FAKE_ERR(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, nullptr),
    FAKE_ERR(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, nullptr),
    FAKE_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, nullptr),
    FAKE_ERR(CUDA_ERROR_CAPTURED_EVENT, nullptr),
    FAKE_ERR(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, nullptr),
    FAKE_ERR(CUDA_ERROR_TIMEOUT, nullptr),
    FAKE_ERR(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, nullptr),
    FAKE_ERR(CUDA_ERROR_EXTERNAL_DEVICE, nullptr),
    FAKE_ERR(CUDA_ERROR_INVALID_CLUSTER_SIZE, nullptr),
    FAKE_ERR(CUDA_ERROR_FUNCTION_NOT_LOADED, nullptr),
    FAKE_ERR(CUDA_ERROR_INVALID_RESOURCE_TYPE, nullptr),
    FAKE_ERR(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, nullptr),
    FAKE_ERR(CUDA_ERROR_KEY_ROTATION, nullptr),
    FAKE_ERR(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef FAKE_ERR

const ErrorText* findError(CUresult code) {
  for (const ErrorText& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

// "CUDA_ERROR_STREAM_CAPTURE_MERGE" -> "stream capture merge": built once for
// every code without a hand-written text, kept for the life of the process
// (callers keep the pointer), read without locking.
const char* derivedDescription(const ErrorText& e) {
  static const auto* texts = [] {
    auto* m = new std::map<int, std::string>;
    for (const ErrorText& t : kErrors) {
      if (t.description != nullptr) continue;
      std::string s(std::string_view(t.name).substr(std::string_view("CUDA_ERROR_").size()));
      for (char& c : s) c = c == '_' ? ' ' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      m->emplace(t.code, std::move(s));
    }
    return m;
  }();
  auto it = texts->find(e.code);
  return it == texts->end() ? e.name : it->second.c_str();
}

}  // namespace
}  // namespace fakecuda

FAKE_API CUresult cuGetErrorString(CUresult error, const char** pStr) {
  FAKE_ENTER_NOINIT("cuGetErrorString");
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    const ErrorText* e = findError(error);
    if (e == nullptr) {
      *pStr = nullptr;
      return CUDA_ERROR_INVALID_VALUE;
    }
    *pStr = e->description != nullptr ? e->description : derivedDescription(*e);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuGetErrorName(CUresult error, const char** pStr) {
  FAKE_ENTER_NOINIT("cuGetErrorName");
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = findError(error);
  *pStr = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// ===========================================================================
// Devices.

FAKE_API CUresult cuDeviceGetCount(int* count) {
  FAKE_ENTER("cuDeviceGetCount");
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  *count = static_cast<int>(d.contexts.size());
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  FAKE_ENTER("cuDeviceGet");
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  if (!validDevice(d, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetName");
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  if (!validDevice(d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "Shoal fake CUDA device %d", dev);
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetUuid");
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  if (!validDevice(d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *uuid = deviceUuid(physicalOf(d, dev));
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  FAKE_ENTER("cuDeviceTotalMem");
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  if (!validDevice(d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = kDeviceTotalMem;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetAttribute");
  if (pi == nullptr || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  int physical = 0;
  {
    std::lock_guard lk(d.mu);
    if (!validDevice(d, dev)) return CUDA_ERROR_INVALID_DEVICE;
    physical = physicalOf(d, dev);
  }
  const int memops = knobs().memops.load() ? 1 : 0;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = kMultiprocessors; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = physical; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *pi = 1; break;  // cuMemAllocAsync works
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: *pi = memops; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: *pi = memops; break;
    default: *pi = 0; break;  // not modelled
  }
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetPCIBusId");
  if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  if (!validDevice(d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(pciBusId, static_cast<size_t>(len), "%04x:%02x:%02x.0", 0, physicalOf(d, dev), 0);
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  FAKE_ENTER("cuDeviceCanAccessPeer");
  if (canAccessPeer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  if (!validDevice(d, dev) || !validDevice(d, peerDev)) return CUDA_ERROR_INVALID_DEVICE;
  *canAccessPeer = dev != peerDev && knobs().peerAccess.load() ? 1 : 0;  // all emulated devices share one host
  return CUDA_SUCCESS;
}

// ===========================================================================
// Contexts.

FAKE_API CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRetain");
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  if (!validDevice(d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  Context* c = d.contexts[static_cast<size_t>(dev)].get();
  ++c->retains;
  *pctx = toHandle(c);
  return CUDA_SUCCESS;
}

// The primary context is never torn down here (its streams and memory stay
// valid at a zero count); only the count is kept, for cuDevicePrimaryCtxGetState.
FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRelease");
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  if (!validDevice(d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  Context* c = d.contexts[static_cast<size_t>(dev)].get();
  if (c->retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --c->retains;
  return CUDA_SUCCESS;
}

// A reset makes the primary context a new instance at the same handle (a new
// cuCtxGetId), unloads its modules, whose functions then fail at launch with
// CUDA_ERROR_INVALID_HANDLE, and destroys its streams (their handles are
// invalid; queued work drains; the default stream is made anew on use). Its
// memory is kept (not emulated: a real reset frees it too).
FAKE_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxReset");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::vector<std::shared_ptr<Stream>> ending;
    {
      std::lock_guard lk(d.mu);
      if (!validDevice(d, dev)) return CUDA_ERROR_INVALID_DEVICE;
      Context* c = d.contexts[static_cast<size_t>(dev)].get();
      c->id = d.nextId++;
      for (auto it = d.modules.begin(); it != d.modules.end();) {
        if (it->second->ctx != c) {
          ++it;
          continue;
        }
        for (auto& f : it->second->functions) d.functions.erase(f.get());
        it = d.modules.erase(it);
      }
      for (auto it = d.liveStreams.begin(); it != d.liveStreams.end();) {
        if (it->second->ctx != c) {
          ++it;
          continue;
        }
        ending.push_back(std::move(it->second));
        it = d.liveStreams.erase(it);
      }
      if (c->defaultStream) ending.push_back(std::move(c->defaultStream));
      c->defaultStream.reset();
    }
    // As cuStreamDestroy: each worker drains what is queued, then ends.
    for (auto& stream : ending) {
      if (stream->orphaned.load()) continue;
      {
        std::lock_guard sl(stream->mu);
        stream->destroyRequested = true;
      }
      stream->workCv.notify_all();
    }
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  FAKE_ENTER("cuDevicePrimaryCtxGetState");
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  if (!validDevice(d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = d.contexts[static_cast<size_t>(dev)]->retains > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  FAKE_ENTER("cuCtxSetCurrent");
  return guarded([&]() -> CUresult {
    if (ctx == nullptr) {  // as cuda.h: pops the top, if any
      if (!tCtxStack.empty()) tCtxStack.pop_back();
      return CUDA_SUCCESS;
    }
    Driver& d = drv();
    Context* c;
    {
      std::lock_guard lk(d.mu);
      c = contextFromHandle(d, ctx);
    }
    if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (tCtxStack.empty()) {
      tCtxStack.push_back(c);
    } else {
      tCtxStack.back() = c;
    }
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuCtxGetCurrent(CUcontext* pctx) {
  FAKE_ENTER("cuCtxGetCurrent");
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = toHandle(currentContext());
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  FAKE_ENTER("cuCtxPushCurrent");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    Context* c;
    {
      std::lock_guard lk(d.mu);
      c = contextFromHandle(d, ctx);
    }
    if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    tCtxStack.push_back(c);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  FAKE_ENTER("cuCtxPopCurrent");
  if (tCtxStack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = toHandle(tCtxStack.back());
  tCtxStack.pop_back();
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxGetDevice(CUdevice* device) {
  FAKE_ENTER("cuCtxGetDevice");
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* c = currentContext();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = c->device;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxGetId(CUcontext ctx, unsigned long long* ctxId) {
  FAKE_ENTER("cuCtxGetId");
  if (ctxId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  Context* c = ctx == nullptr ? currentContext() : contextFromHandle(d, ctx);
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *ctxId = c->id;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  FAKE_ENTER("cuCtxGetStreamPriorityRange");
  if (leastPriority != nullptr) *leastPriority = kStreamPriorityLeast;
  if (greatestPriority != nullptr) *greatestPriority = kStreamPriorityGreatest;
  return CUDA_SUCCESS;
}

// Waits for everything queued so far on every stream of the current context,
// including destroyed streams still draining.
FAKE_API CUresult cuCtxSynchronize(void) {
  FAKE_ENTER("cuCtxSynchronize");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&]() -> CUresult {
    Context* c = currentContext();
    if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    Driver& d = drv();
    std::vector<std::shared_ptr<Stream>> streams;
    {
      std::lock_guard lk(d.mu);
      for (auto& [raw, s] : d.running) {
        if (s->ctx == c) streams.push_back(s);
      }
    }
    for (auto& s : streams) {
      std::lock_guard lk(s->mu);
      if (s->captureStatus != CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    for (auto& s : streams) {
      if (CUresult r = synchronizeStream(*s); r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
  });
}

// ===========================================================================
// Device, managed and pinned host memory.

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  FAKE_ENTER("cuMemAlloc");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Context* c = currentContext();
    if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    return allocDeviceLocked(d, c, bytesize, dptr);
  });
}

FAKE_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
  FAKE_ENTER("cuMemFree");
  if (captureProhibitsFree()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (dptr == 0) return CUDA_SUCCESS;  // freeing NULL is a no-op
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    return freeDeviceLocked(d, dptr);
  });
}

// Stream-ordered allocation without a pool: memory is usable at once, and a
// free only retires the address (queued work keeps what it touches).
FAKE_API CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  FAKE_ENTER("cuMemAllocAsync");
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStreamLocked(d, hStream, s); r != CUDA_SUCCESS) return r;
    return allocDeviceLocked(d, s->ctx, bytesize, dptr);
  });
}

FAKE_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  FAKE_ENTER("cuMemFreeAsync");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStreamLocked(d, hStream, s); r != CUDA_SUCCESS) return r;
    return freeDeviceLocked(d, dptr);
  });
}

FAKE_API CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  FAKE_ENTER("cuMemAllocManaged");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Context* c = currentContext();
    if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    const size_t len = roundUp(bytesize, pageSize());
    void* p = mapHostMemory(len);  // host-accessible, as managed memory is
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    auto backing = std::make_shared<Backing>();
    backing->addr = p;
    backing->len = len;
    Allocation a;
    a.base = reinterpret_cast<uintptr_t>(p);
    a.size = bytesize;
    a.mappedLen = len;
    a.kind = MemKind::Managed;
    a.device = c->device;
    a.ctx = c;
    a.alias = static_cast<char*>(p);
    a.backing = std::move(backing);
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    addAllocationLocked(d, std::move(a));
    *dptr = reinterpret_cast<uintptr_t>(p);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  FAKE_ENTER("cuMemGetInfo");
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* c = currentContext();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  auto it = d.deviceBytesInUse.find(c->device);
  *total = kDeviceTotalMem;
  *free = kDeviceTotalMem - (it == d.deviceBytesInUse.end() ? 0 : it->second);
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  FAKE_ENTER("cuMemGetAddressRange");
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  Allocation* a = findAllocationLocked(d, static_cast<uintptr_t>(dptr));
  if (a == nullptr || a->kind == MemKind::RegisteredHost) return CUDA_ERROR_NOT_FOUND;
  if (pbase != nullptr) *pbase = a->base;
  if (psize != nullptr) *psize = a->size;
  return CUDA_SUCCESS;
}

namespace fakecuda {
namespace {

constexpr unsigned kHostAllocFlags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
constexpr unsigned kHostRegisterFlags =
    CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;

CUresult hostAllocImpl(void** pp, size_t bytesize, unsigned flags) {
  if (pp == nullptr || bytesize == 0 || (flags & ~kHostAllocFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  Context* c = currentContext();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const size_t len = roundUp(bytesize, pageSize());
  void* p = mapHostMemory(len);
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  auto backing = std::make_shared<Backing>();
  backing->addr = p;
  backing->len = len;
  Allocation a;
  a.base = reinterpret_cast<uintptr_t>(p);
  a.size = bytesize;
  a.mappedLen = len;
  a.kind = MemKind::PinnedHost;
  a.device = c->device;
  a.ctx = c;
  a.alias = static_cast<char*>(p);
  a.backing = std::move(backing);
  a.hostFlags = flags;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  addAllocationLocked(d, std::move(a));
  *pp = p;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace fakecuda

FAKE_API CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  FAKE_ENTER("cuMemHostAlloc");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&] { return hostAllocImpl(pp, bytesize, Flags); });
}

FAKE_API CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  FAKE_ENTER("cuMemAllocHost");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&] { return hostAllocImpl(pp, bytesize, 0); });
}

FAKE_API CUresult cuMemFreeHost(void* p) {
  FAKE_ENTER("cuMemFreeHost");
  if (captureProhibitsFree()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto it = d.allocations.find(reinterpret_cast<uintptr_t>(p));
    if (it == d.allocations.end() || it->second.kind != MemKind::PinnedHost) return CUDA_ERROR_INVALID_VALUE;
    d.allocations.erase(it);  // unmapped with the last queued user
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  FAKE_ENTER("cuMemHostRegister");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (p == nullptr || bytesize == 0 || (Flags & ~kHostRegisterFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Context* c = currentContext();
    if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    const uintptr_t base = reinterpret_cast<uintptr_t>(p);
    if (bytesize > UINTPTR_MAX - base) return CUDA_ERROR_INVALID_VALUE;
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    // Any overlap with a known range (including pinned allocations) is refused.
    if (findAllocationLocked(d, base) != nullptr) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    auto next = d.allocations.upper_bound(base);
    if (next != d.allocations.end() && next->first < base + bytesize) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    Allocation a;
    a.base = base;
    a.size = bytesize;
    a.mappedLen = bytesize;
    a.kind = MemKind::RegisteredHost;
    a.device = c->device;
    a.ctx = c;
    a.alias = static_cast<char*>(p);  // the caller's own memory; nothing to keep alive
    a.hostFlags = Flags;
    addAllocationLocked(d, std::move(a));
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuMemHostUnregister(void* p) {
  FAKE_ENTER("cuMemHostUnregister");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto it = d.allocations.find(reinterpret_cast<uintptr_t>(p));
    if (it == d.allocations.end() || it->second.kind != MemKind::RegisteredHost) {
      return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
    d.allocations.erase(it);
    return CUDA_SUCCESS;
  });
}

// Unified addressing: pinned host memory has the same address on the device.
FAKE_API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  FAKE_ENTER("cuMemHostGetDevicePointer");
  if (pdptr == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  Allocation* a = findAllocationLocked(d, reinterpret_cast<uintptr_t>(p));
  if (a == nullptr || (a->kind != MemKind::PinnedHost && a->kind != MemKind::RegisteredHost)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // As documented: memory allocated or registered without DEVICEMAP has no
  // device pointer to give (drivers with unified addressing answer anyway;
  // code that relies on that is refused here).
  static_assert(CU_MEMHOSTALLOC_DEVICEMAP == CU_MEMHOSTREGISTER_DEVICEMAP);
  if ((a->hostFlags & CU_MEMHOSTALLOC_DEVICEMAP) == 0) return CUDA_ERROR_INVALID_VALUE;
  *pdptr = reinterpret_cast<uintptr_t>(p);
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  FAKE_ENTER("cuMemHostGetFlags");
  if (pFlags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  Allocation* a = findAllocationLocked(d, reinterpret_cast<uintptr_t>(p));
  if (a == nullptr || (a->kind != MemKind::PinnedHost && a->kind != MemKind::RegisteredHost)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *pFlags = a->hostFlags;
  return CUDA_SUCCESS;
}

// ===========================================================================
// Pointer attributes.

namespace fakecuda {
namespace {

struct PointerInfo {
  bool known = false;
  MemKind kind = MemKind::Device;
  uintptr_t ptr = 0;
  int device = CU_DEVICE_INVALID;  // what the driver reports for unknown memory
  Context* ctx = nullptr;
  uintptr_t base = 0;
  size_t size = 0;
  uintptr_t rangeBase = 0;
  size_t rangeSize = 0;
  uint64_t bufferId = 0;
  uint64_t physHandle = 0;
  uint64_t allowedHandleTypes = 0;
  unsigned accessFlags = 0;
};

PointerInfo pointerInfo(CUdeviceptr ptr) {
  PointerInfo info;
  info.ptr = static_cast<uintptr_t>(ptr);
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  const Allocation* a = findAllocationLocked(d, info.ptr);
  if (a == nullptr) return info;
  info.known = true;
  info.kind = a->kind;
  info.device = a->device;
  info.ctx = a->ctx;
  info.base = a->base;
  info.size = a->size;
  info.rangeBase = a->rangeBase;
  info.rangeSize = a->rangeSize;
  info.bufferId = a->bufferId;
  info.physHandle = a->physHandle;
  info.allowedHandleTypes = a->allowedHandleTypes;
  info.accessFlags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (a->kind == MemKind::Mapped) {
    Context* c = currentContext();
    auto it = c != nullptr ? a->access.find(c->device) : a->access.end();
    info.accessFlags = it == a->access.end() ? CU_MEM_ACCESS_FLAGS_PROT_NONE : it->second;
  }
  return info;
}

template <class T>
void put(void* data, T value) {
  std::memcpy(data, &value, sizeof(T));
}

// Writes one attribute. Boolean attributes are written as int (4 bytes), the
// width the real driver writes; callers must not pass a 1-byte bool.
// `strict` (cuPointerGetAttribute) refuses what has no value; the plural form
// writes the driver's defaults instead (cuda.h: not an error).
CUresult writePointerAttribute(unsigned attr, void* data, const PointerInfo& p, bool strict) {
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (strict && !p.known) return CUDA_ERROR_INVALID_VALUE;
  const bool hostVisible = p.known && !isDeviceKind(p.kind);
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      put<CUcontext>(data, toHandle(p.ctx));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: {
      unsigned type = 0;
      if (p.known) {
        // Managed memory reports DEVICE (the driver API has no managed type).
        type = p.kind == MemKind::PinnedHost || p.kind == MemKind::RegisteredHost ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      }
      put<unsigned>(data, type);
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      put<CUdeviceptr>(data, p.known ? p.ptr : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (strict && !hostVisible) return CUDA_ERROR_INVALID_VALUE;
      put<void*>(data, hostVisible ? reinterpret_cast<void*>(p.ptr) : nullptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      put<int>(data, 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      put<unsigned long long>(data, p.bufferId);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      put<int>(data, p.known && p.kind == MemKind::Managed ? 1 : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      put<int>(data, p.device);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      put<int>(data, p.known && p.kind == MemKind::Device ? 1 : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      put<CUdeviceptr>(data, p.rangeBase);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      put<size_t>(data, p.rangeSize);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      put<int>(data, p.known ? 1 : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      put<unsigned long long>(data, p.allowedHandleTypes);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
      put<int>(data, 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
      put<unsigned>(data, p.known ? p.accessFlags : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      put<CUmemoryPool>(data, nullptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      put<size_t>(data, p.size);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      put<void*>(data, reinterpret_cast<void*>(p.base));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      put<unsigned long long>(data, p.physHandle != 0 ? p.physHandle : p.bufferId);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
      return CUDA_ERROR_NOT_SUPPORTED;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace
}  // namespace fakecuda

// As the real driver, pointer queries need a context current on the calling
// thread (any: addressing is unified): CUDA_ERROR_INVALID_CONTEXT without.
FAKE_API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  FAKE_ENTER("cuPointerGetAttribute");
  if (currentContext() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return guarded([&] { return writePointerAttribute(rawEnum(attribute), data, pointerInfo(ptr), true); });
}

FAKE_API CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes, void** data,
                                         CUdeviceptr ptr) {
  FAKE_ENTER("cuPointerGetAttributes");
  if (numAttributes == 0 || attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (currentContext() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return guarded([&]() -> CUresult {
    const PointerInfo info = pointerInfo(ptr);
    for (unsigned i = 0; i < numAttributes; ++i) {
      if (CUresult r = writePointerAttribute(rawEnum(attributes[i]), data[i], info, false); r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
  });
}

// ===========================================================================
// Copies and memsets: unified addressing, so every form takes any kind of
// memory. Synchronous forms run on the current context's default stream.

FAKE_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  FAKE_ENTER("cuMemcpy");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&] { return copyImpl(dst, src, ByteCount, nullptr, true); });
}

FAKE_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  FAKE_ENTER("cuMemcpyHtoD");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&] { return copyImpl(dstDevice, reinterpret_cast<uintptr_t>(srcHost), ByteCount, nullptr, true); });
}

FAKE_API CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  FAKE_ENTER("cuMemcpyDtoH");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&] { return copyImpl(reinterpret_cast<uintptr_t>(dstHost), srcDevice, ByteCount, nullptr, true); });
}

FAKE_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  FAKE_ENTER("cuMemcpyDtoD");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&] { return copyImpl(dstDevice, srcDevice, ByteCount, nullptr, true); });
}

FAKE_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  FAKE_ENTER("cuMemcpyAsync");
  return guarded([&] { return copyImpl(dst, src, ByteCount, hStream, false); });
}

FAKE_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, CUstream hStream) {
  FAKE_ENTER("cuMemcpyHtoDAsync");
  return guarded([&] { return copyImpl(dstDevice, reinterpret_cast<uintptr_t>(srcHost), ByteCount, hStream, false); });
}

FAKE_API CUresult cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  FAKE_ENTER("cuMemcpyDtoHAsync");
  return guarded([&] { return copyImpl(reinterpret_cast<uintptr_t>(dstHost), srcDevice, ByteCount, hStream, false); });
}

FAKE_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  FAKE_ENTER("cuMemcpyDtoDAsync");
  return guarded([&] { return copyImpl(dstDevice, srcDevice, ByteCount, hStream, false); });
}

FAKE_API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  FAKE_ENTER("cuMemsetD8");
  return guarded([&] { return memsetImpl(dstDevice, uc, N, 1, nullptr, true); });
}

FAKE_API CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  FAKE_ENTER("cuMemsetD32");
  return guarded([&] { return memsetImpl(dstDevice, ui, N, 4, nullptr, true); });
}

FAKE_API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  FAKE_ENTER("cuMemsetD8Async");
  return guarded([&] { return memsetImpl(dstDevice, uc, N, 1, hStream, false); });
}

FAKE_API CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  FAKE_ENTER("cuMemsetD32Async");
  return guarded([&] { return memsetImpl(dstDevice, ui, N, 4, hStream, false); });
}

// ===========================================================================
// Streams.

namespace fakecuda {
namespace {

CUresult createStream(CUstream* phStream, unsigned flags, int priority) {
  if (phStream == nullptr || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) return CUDA_ERROR_INVALID_VALUE;
  Context* c = currentContext();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  // As the driver does, clamp the priority into [greatest, least].
  priority = std::clamp(priority, kStreamPriorityGreatest, kStreamPriorityLeast);
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  std::shared_ptr<Stream> s;
  if (CUresult r = startStreamLocked(d, c, flags, priority, false, s); r != CUDA_SUCCESS) return r;
  d.liveStreams.emplace(s.get(), s);
  *phStream = reinterpret_cast<CUstream>(s.get());
  return CUDA_SUCCESS;
}

// Resolves a handle outside d.mu.
CUresult resolveStream(CUstream h, std::shared_ptr<Stream>& out) {
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  return resolveStreamLocked(d, h, out);
}

}  // namespace
}  // namespace fakecuda

FAKE_API CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  FAKE_ENTER("cuStreamCreate");
  return guarded([&] { return createStream(phStream, Flags, 0); });
}

FAKE_API CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  FAKE_ENTER("cuStreamCreateWithPriority");
  return guarded([&] { return createStream(phStream, flags, priority); });
}

namespace fakecuda {
namespace {
void destroyGraph(Graph* g);  // stream capture, below
}  // namespace
}  // namespace fakecuda

// Returns at once, as the driver does: the worker finishes what is queued and
// then ends. The handle is invalid from now on.
FAKE_API CUresult cuStreamDestroy_v2(CUstream hStream) {
  FAKE_ENTER("cuStreamDestroy");
  if (isDefaultStreamHandle(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::shared_ptr<Stream> s;
    {
      std::lock_guard lk(d.mu);
      auto it = d.liveStreams.find(reinterpret_cast<Stream*>(hStream));
      if (it == d.liveStreams.end()) return CUDA_ERROR_INVALID_HANDLE;
      s = std::move(it->second);
      d.liveStreams.erase(it);
    }
    if (s->orphaned.load()) return CUDA_SUCCESS;  // inherited through fork: nothing runs it
    Graph* unfinished = nullptr;
    {
      std::lock_guard lk(s->mu);
      s->destroyRequested = true;
      if (s->captureStatus != CU_STREAM_CAPTURE_STATUS_NONE)
        noteCaptureEnded(s->captureMode, s->captureThread == std::this_thread::get_id());
      s->captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;  // an unfinished capture is dropped
      unfinished = std::exchange(s->captureGraph, nullptr);
    }
    if (unfinished != nullptr) destroyGraph(unfinished);
    s->workCv.notify_all();
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuStreamSynchronize(CUstream hStream) {
  FAKE_ENTER("cuStreamSynchronize");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStream(hStream, s); r != CUDA_SUCCESS) return r;
    return synchronizeStream(*s);
  });
}

FAKE_API CUresult cuStreamQuery(CUstream hStream) {
  FAKE_ENTER("cuStreamQuery");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStream(hStream, s); r != CUDA_SUCCESS) return r;
    std::lock_guard lk(s->mu);
    if (s->captureStatus != CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return s->completed == s->enqueued ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

FAKE_API CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  FAKE_ENTER("cuStreamGetCtx");
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStream(hStream, s); r != CUDA_SUCCESS) return r;
    *pctx = toHandle(s->ctx);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuStreamGetFlags(CUstream hStream, unsigned int* flags) {
  FAKE_ENTER("cuStreamGetFlags");
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStream(hStream, s); r != CUDA_SUCCESS) return r;
    *flags = s->flags;
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuStreamGetPriority(CUstream hStream, int* priority) {
  FAKE_ENTER("cuStreamGetPriority");
  if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStream(hStream, s); r != CUDA_SUCCESS) return r;
    *priority = s->priority;
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  FAKE_ENTER("cuLaunchHostFunc");
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStream(hStream, s); r != CUDA_SUCCESS) return r;
    return enqueue(*s, [fn, userData] {
      struct InHostFn {  // CUDA calls from here are flagged (see enter())
        InHostFn() { tInHostFn = true; }
        ~InHostFn() { tInHostFn = false; }
      } scope;
      fn(userData);
    });
  });
}

// ===========================================================================
// Stream memory operations.

FAKE_API CUresult cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  FAKE_ENTER("cuStreamWaitValue32");
  return guarded([&] {
    return enqueueMemOps(stream, [&](Driver& d, int dev, std::vector<MemOpStep>& steps) {
      return prepareWait(d, dev, addr, value, flags, false, steps);
    });
  });
}

FAKE_API CUresult cuStreamWaitValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  FAKE_ENTER("cuStreamWaitValue64");
  return guarded([&] {
    return enqueueMemOps(stream, [&](Driver& d, int dev, std::vector<MemOpStep>& steps) {
      return prepareWait(d, dev, addr, value, flags, true, steps);
    });
  });
}

FAKE_API CUresult cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  FAKE_ENTER("cuStreamWriteValue32");
  return guarded([&] {
    return enqueueMemOps(stream, [&](Driver& d, int dev, std::vector<MemOpStep>& steps) {
      return prepareWrite(d, dev, addr, value, flags, false, steps);
    });
  });
}

FAKE_API CUresult cuStreamWriteValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  FAKE_ENTER("cuStreamWriteValue64");
  return guarded([&] {
    return enqueueMemOps(stream, [&](Driver& d, int dev, std::vector<MemOpStep>& steps) {
      return prepareWrite(d, dev, addr, value, flags, true, steps);
    });
  });
}

// The whole batch is validated before anything is queued, then runs in order
// as one stream operation.
FAKE_API CUresult cuStreamBatchMemOp_v2(CUstream stream, unsigned int count, CUstreamBatchMemOpParams* paramArray,
                                        unsigned int flags) {
  FAKE_ENTER("cuStreamBatchMemOp");
  if (flags != 0 || count > kMaxBatchMemOps || (count > 0 && paramArray == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (!knobs().batchMemops.load()) return CUDA_ERROR_NOT_SUPPORTED;
  return guarded([&] {
    return enqueueMemOps(stream, [&](Driver& d, int dev, std::vector<MemOpStep>& steps) -> CUresult {
      for (unsigned i = 0; i < count; ++i) {
        const CUstreamBatchMemOpParams& p = paramArray[i];
        CUresult r = CUDA_SUCCESS;
        switch (rawEnum(p.operation)) {
          case CU_STREAM_MEM_OP_WAIT_VALUE_32:
            r = prepareWait(d, dev, p.waitValue.address, p.waitValue.value, p.waitValue.flags, false, steps);
            break;
          case CU_STREAM_MEM_OP_WAIT_VALUE_64:
            r = prepareWait(d, dev, p.waitValue.address, p.waitValue.value64, p.waitValue.flags, true, steps);
            break;
          case CU_STREAM_MEM_OP_WRITE_VALUE_32:
            r = prepareWrite(d, dev, p.writeValue.address, p.writeValue.value, p.writeValue.flags, false, steps);
            break;
          case CU_STREAM_MEM_OP_WRITE_VALUE_64:
            r = prepareWrite(d, dev, p.writeValue.address, p.writeValue.value64, p.writeValue.flags, true, steps);
            break;
          case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
          case CU_STREAM_MEM_OP_BARRIER:
            steps.push_back(MemOpStep{});  // a full fence
            break;
          default:
            r = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        if (r != CUDA_SUCCESS) return r;
      }
      return CUDA_SUCCESS;
    });
  });
}

// ===========================================================================
// Events.

namespace fakecuda {
namespace {

constexpr unsigned kEventFlags = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;

// Requires d.mu.
Event* findEventLocked(Driver& d, CUevent h) {
  auto it = d.events.find(reinterpret_cast<Event*>(h));
  return it == d.events.end() ? nullptr : it->second.get();
}

// The event's current record point (nullptr: never recorded).
CUresult eventMarker(CUevent h, std::shared_ptr<Marker>& out, unsigned* flags = nullptr) {
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  Event* e = findEventLocked(d, h);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  out = e->marker;
  if (flags) *flags = e->flags;
  return CUDA_SUCCESS;
}

CUresult recordEvent(CUevent hEvent, CUstream hStream) {
  Driver& d = drv();
  std::shared_ptr<Stream> s;
  {
    std::lock_guard lk(d.mu);
    if (findEventLocked(d, hEvent) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (CUresult r = resolveStreamLocked(d, hStream, s); r != CUDA_SUCCESS) return r;
  }
  auto m = std::make_shared<Marker>();
  m->stream = s;
  uint64_t seq = 0;
  if (CUresult r = enqueue(*s, [m] { m->doneNs.store(nowNs(), std::memory_order_release); }, &seq); r != CUDA_SUCCESS) {
    return r;
  }
  if (seq == 0) return CUDA_SUCCESS;  // captured: the event itself is untouched
  m->seq = seq;
  std::lock_guard lk(d.mu);
  if (Event* e = findEventLocked(d, hEvent)) e->marker = std::move(m);
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace fakecuda

FAKE_API CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  FAKE_ENTER("cuEventCreate");
  if (phEvent == nullptr || (Flags & ~kEventFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  if ((Flags & CU_EVENT_INTERPROCESS) != 0 && (Flags & CU_EVENT_DISABLE_TIMING) == 0) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    if (currentContext() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    auto e = std::make_unique<Event>();
    e->flags = Flags;
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    Event* raw = e.get();
    d.events.emplace(raw, std::move(e));
    *phEvent = reinterpret_cast<CUevent>(raw);
    return CUDA_SUCCESS;
  });
}

// Allowed while the recorded work is pending, as with the driver.
FAKE_API CUresult cuEventDestroy_v2(CUevent hEvent) {
  FAKE_ENTER("cuEventDestroy");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    return d.events.erase(reinterpret_cast<Event*>(hEvent)) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  });
}

FAKE_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  FAKE_ENTER("cuEventRecord");
  return guarded([&] { return recordEvent(hEvent, hStream); });
}

FAKE_API CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  FAKE_ENTER("cuEventRecordWithFlags");
  if ((flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&] { return recordEvent(hEvent, hStream); });
}

FAKE_API CUresult cuEventQuery(CUevent hEvent) {
  FAKE_ENTER("cuEventQuery");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Marker> m;
    if (CUresult r = eventMarker(hEvent, m); r != CUDA_SUCCESS) return r;
    if (!m) return CUDA_SUCCESS;  // never recorded: complete
    if (m->stream->orphaned.load()) return CUDA_ERROR_INVALID_HANDLE;
    return m->doneNs.load(std::memory_order_acquire) >= 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

FAKE_API CUresult cuEventSynchronize(CUevent hEvent) {
  FAKE_ENTER("cuEventSynchronize");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Marker> m;
    if (CUresult r = eventMarker(hEvent, m); r != CUDA_SUCCESS) return r;
    if (!m) return CUDA_SUCCESS;
    return waitForSeq(*m->stream, m->seq);
  });
}

FAKE_API CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  FAKE_ENTER("cuEventElapsedTime");
  if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Marker> a, b;
    unsigned fa = 0, fb = 0;
    if (CUresult r = eventMarker(hStart, a, &fa); r != CUDA_SUCCESS) return r;
    if (CUresult r = eventMarker(hEnd, b, &fb); r != CUDA_SUCCESS) return r;
    if (((fa | fb) & CU_EVENT_DISABLE_TIMING) != 0 || !a || !b) return CUDA_ERROR_INVALID_HANDLE;
    const int64_t ta = a->doneNs.load(std::memory_order_acquire);
    const int64_t tb = b->doneNs.load(std::memory_order_acquire);
    if (ta < 0 || tb < 0) return CUDA_ERROR_NOT_READY;
    *pMilliseconds = static_cast<float>(static_cast<double>(tb - ta) / 1e6);
    return CUDA_SUCCESS;
  });
}

// The waiting stream's later work starts once the event's recorded point on
// the other stream has run. An event never recorded is complete: no wait.
FAKE_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  FAKE_ENTER("cuStreamWaitEvent");
  if ((Flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Marker> m;
    if (CUresult r = eventMarker(hEvent, m); r != CUDA_SUCCESS) return r;
    if (m && m->stream->orphaned.load()) return CUDA_ERROR_INVALID_HANDLE;  // recorded before fork()
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStream(hStream, s); r != CUDA_SUCCESS) return r;
    if (!m || m->stream == s) {
      return enqueue(*s, [] {});  // already ordered; still counts as captured work
    }
    Stream* self = s.get();
    return enqueue(*s, [self, m] { waitOnOtherStream(*self, *m->stream, m->seq); });
  });
}

// ===========================================================================
// Stream capture and graphs. Work issued on a capturing stream is recorded in
// its graph (a chain: the stand-in captures one stream at a time; an event
// that joins another stream into the capture records no dependency), and
// each launch of an executable graph enqueues the recorded work, in order,
// on the launch stream. User objects follow CUDA's reference counts: the
// graph's references are copied into each executable graph, and the
// destructor runs (as a host function: no CUDA calls) when the last goes.

namespace fakecuda {
namespace {

// Requires d.mu. Drops `count` references; returns the object if that was
// its last (the caller runs the destructor outside the lock).
UserObject* releaseUserObjectLocked(Driver& d, UserObject* o, unsigned count) {
  o->refs = count >= o->refs ? 0 : o->refs - count;
  if (o->refs != 0) return nullptr;
  d.userObjects.erase(o);
  return o;
}

// As the driver does, later and on a thread of its own (the caller may hold
// locks the destructor takes).
void runUserObjectDestructors(std::vector<UserObject*> dead) {
  if (dead.empty()) return;
  auto run = [dead] {
    for (UserObject* o : dead) {
      {
        struct InHostFn {  // CUDA calls from a destructor are flagged, as from host functions
          InHostFn() { tInHostFn = true; }
          ~InHostFn() { tInHostFn = false; }
        } scope;
        if (o->destroy != nullptr) o->destroy(o->ptr);
      }
      delete o;
    }
  };
  try {
    std::thread(run).detach();
  } catch (const std::system_error&) {
    run();
  }
}

// Requires d.mu.
void releaseAllLocked(Driver& d, const std::map<UserObject*, unsigned>& refs, std::vector<UserObject*>& dead) {
  for (const auto& [o, n] : refs)
    if (UserObject* gone = releaseUserObjectLocked(d, o, n)) dead.push_back(gone);
}

// Erases a graph and releases its user objects' references.
void destroyGraph(Graph* g) {
  Driver& d = drv();
  std::vector<UserObject*> dead;
  {
    std::lock_guard lk(d.mu);
    auto it = d.graphs.find(g);
    if (it == d.graphs.end()) return;
    releaseAllLocked(d, it->second->userRefs, dead);
    d.graphs.erase(it);
  }
  runUserObjectDestructors(dead);
}

}  // namespace
}  // namespace fakecuda

FAKE_API CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  FAKE_ENTER("cuStreamBeginCapture");
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The legacy default stream cannot be captured; the stand-in shares one
  // default stream for all three default handles, so none can.
  if (isDefaultStreamHandle(hStream)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::shared_ptr<Stream> s;
    uint64_t id;
    Graph* graph = nullptr;
    {
      std::lock_guard lk(d.mu);
      if (CUresult r = resolveStreamLocked(d, hStream, s); r != CUDA_SUCCESS) return r;
      id = d.nextId++;
      auto g = std::make_unique<Graph>();
      g->capturing = true;
      g->origins.push_back(s);
      graph = g.get();
      d.graphs.emplace(graph, std::move(g));
    }
    {
      std::lock_guard lk(s->mu);
      if (s->captureStatus == CU_STREAM_CAPTURE_STATUS_NONE) {
        s->captureStatus = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        s->captureMode = mode;
        s->captureId = id;
        s->capturedOps = 0;
        s->captureGraph = graph;
        s->captureThread = std::this_thread::get_id();
        noteCaptureBegun(mode);
        return CUDA_SUCCESS;
      }
    }
    destroyGraph(graph);
    return CUDA_ERROR_ILLEGAL_STATE;
  });
}

FAKE_API CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  FAKE_ENTER("cuStreamEndCapture");
  if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStream(hStream, s); r != CUDA_SUCCESS) return r;
    Graph* g = nullptr;
    {
      std::lock_guard lk(s->mu);
      if (s->captureStatus == CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_ILLEGAL_STATE;
      // Global and thread-local captures end on the thread that began them.
      if (s->captureMode != CU_STREAM_CAPTURE_MODE_RELAXED && s->captureThread != std::this_thread::get_id())
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
      noteCaptureEnded(s->captureMode, true);
      g = std::exchange(s->captureGraph, nullptr);
      g->capturedOps = s->capturedOps;
      g->capturing = false;
      s->captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
      s->captureId = 0;
      s->capturedOps = 0;
    }
    *phGraph = reinterpret_cast<CUgraph>(g);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  FAKE_ENTER("cuStreamIsCapturing");
  if (captureStatus == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStream(hStream, s); r != CUDA_SUCCESS) return r;
    std::lock_guard lk(s->mu);
    *captureStatus = s->captureStatus;
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                            cuuint64_t* id_out, CUgraph* graph_out,
                                            const CUgraphNode** dependencies_out, const CUgraphEdgeData** edgeData_out,
                                            size_t* numDependencies_out) {
  FAKE_ENTER("cuStreamGetCaptureInfo");
  if (captureStatus_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStream(hStream, s); r != CUDA_SUCCESS) return r;
    std::lock_guard lk(s->mu);
    *captureStatus_out = s->captureStatus;
    if (id_out != nullptr && s->captureStatus != CU_STREAM_CAPTURE_STATUS_NONE) *id_out = s->captureId;
    // The graph being captured; no node handles are kept, so no dependency set.
    if (graph_out != nullptr) *graph_out = reinterpret_cast<CUgraph>(s->captureGraph);
    if (dependencies_out != nullptr) *dependencies_out = nullptr;
    if (edgeData_out != nullptr) *edgeData_out = nullptr;
    if (numDependencies_out != nullptr) *numDependencies_out = 0;
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuGraphDestroy(CUgraph hGraph) {
  FAKE_ENTER("cuGraphDestroy");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    Graph* g = reinterpret_cast<Graph*>(hGraph);
    {
      std::lock_guard lk(d.mu);
      auto it = d.graphs.find(g);
      if (it == d.graphs.end() || it->second->capturing) return CUDA_ERROR_INVALID_VALUE;
    }
    destroyGraph(g);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags) {
  FAKE_ENTER("cuGraphInstantiateWithFlags");
  if (phGraphExec == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto it = d.graphs.find(reinterpret_cast<Graph*>(hGraph));
    if (it == d.graphs.end() || it->second->capturing) return CUDA_ERROR_INVALID_VALUE;
    const Graph& g = *it->second;
    auto exec = std::make_unique<GraphExec>();
    exec->ops = g.ops;
    exec->origins = g.origins;
    exec->userRefs = g.userRefs;
    for (const auto& [o, n] : exec->userRefs) o->refs += n;
    *phGraphExec = reinterpret_cast<CUgraphExec>(exec.get());
    d.graphExecs.emplace(exec.get(), std::move(exec));
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  FAKE_ENTER("cuGraphLaunch");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::shared_ptr<Stream> s;
    std::vector<std::function<void()>> ops;
    std::map<UserObject*, unsigned> held;
    {
      std::lock_guard lk(d.mu);
      auto it = d.graphExecs.find(reinterpret_cast<GraphExec*>(hGraphExec));
      if (it == d.graphExecs.end()) return CUDA_ERROR_INVALID_VALUE;
      if (CUresult r = resolveStreamLocked(d, hStream, s); r != CUDA_SUCCESS) return r;
      ops = it->second->ops;
      // The launch holds the user objects until it has run (an executable
      // graph destroyed meanwhile does not free what the launch uses).
      held = it->second->userRefs;
      for (const auto& [o, n] : held) o->refs += n;
    }
    // The recorded chain, in order, then the launch's references let go.
    ops.push_back([held] {
      Driver& dd = drv();
      std::vector<UserObject*> dead;
      {
        std::lock_guard lk(dd.mu);
        releaseAllLocked(dd, held, dead);
      }
      runUserObjectDestructors(dead);
    });
    for (auto& op : ops)
      if (CUresult r = enqueue(*s, std::move(op)); r != CUDA_SUCCESS) return r;
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  FAKE_ENTER("cuGraphExecDestroy");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::vector<UserObject*> dead;
    {
      std::lock_guard lk(d.mu);
      auto it = d.graphExecs.find(reinterpret_cast<GraphExec*>(hGraphExec));
      if (it == d.graphExecs.end()) return CUDA_ERROR_INVALID_VALUE;
      // Work already launched keeps what it refers to: the recorded
      // operations hold their own views of memory.
      releaseAllLocked(d, it->second->userRefs, dead);
      d.graphExecs.erase(it);
    }
    runUserObjectDestructors(dead);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuUserObjectCreate(CUuserObject* object_out, void* ptr, CUhostFn destroy, unsigned int initialRefcount,
                                     unsigned int flags) {
  FAKE_ENTER("cuUserObjectCreate");
  if (object_out == nullptr || destroy == nullptr || initialRefcount == 0 ||
      flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto* o = new UserObject{ptr, destroy, initialRefcount};
    d.userObjects.insert(o);
    *object_out = reinterpret_cast<CUuserObject>(o);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuUserObjectRetain(CUuserObject object, unsigned int count) {
  FAKE_ENTER("cuUserObjectRetain");
  if (count == 0) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto* o = reinterpret_cast<UserObject*>(object);
    if (d.userObjects.count(o) == 0) return CUDA_ERROR_INVALID_VALUE;
    o->refs += count;
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuUserObjectRelease(CUuserObject object, unsigned int count) {
  FAKE_ENTER("cuUserObjectRelease");
  if (count == 0) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::vector<UserObject*> dead;
    {
      std::lock_guard lk(d.mu);
      auto* o = reinterpret_cast<UserObject*>(object);
      if (d.userObjects.count(o) == 0) return CUDA_ERROR_INVALID_VALUE;
      if (UserObject* gone = releaseUserObjectLocked(d, o, count)) dead.push_back(gone);
    }
    runUserObjectDestructors(dead);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count, unsigned int flags) {
  FAKE_ENTER("cuGraphRetainUserObject");
  if (count == 0 || (flags & ~static_cast<unsigned>(CU_GRAPH_USER_OBJECT_MOVE)) != 0) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto it = d.graphs.find(reinterpret_cast<Graph*>(graph));
    auto* o = reinterpret_cast<UserObject*>(object);
    if (it == d.graphs.end() || d.userObjects.count(o) == 0) return CUDA_ERROR_INVALID_VALUE;
    // MOVE hands over the caller's references; otherwise new ones are taken.
    if ((flags & CU_GRAPH_USER_OBJECT_MOVE) == 0) o->refs += count;
    it->second->userRefs[o] += count;
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  FAKE_ENTER("cuThreadExchangeStreamCaptureMode");
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      *mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::swap(*mode, tCaptureMode);
  return CUDA_SUCCESS;
}

// ===========================================================================
// Shareable memory (cuMem VMM). Physical memory is a memfd; cuMemMap maps it
// PROT_NONE at the reserved address plus a read/write alias for the stand-in.

namespace fakecuda {
namespace {

// Requires d.mu.
CUresult validateAllocationProp(Driver& d, const CUmemAllocationProp* prop) {
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(d, prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  // Only POSIX file descriptors can be emulated (no fabric, no Windows handles).
  if ((prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}

// Requires d.mu. Hands the pages back to the reservation (inaccessible again).
void restoreReservation(uintptr_t base, size_t len) {
  mmap(reinterpret_cast<void*>(base), len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

// Requires d.mu. The cuMemMap mappings that together cover [ptr, ptr+size);
// with `exact`, they must also start at ptr and end at ptr+size.
CUresult mappingsCoveringLocked(Driver& d, uintptr_t ptr, size_t size, bool exact, std::vector<Allocation*>& out) {
  if (size == 0 || size > UINTPTR_MAX - ptr) return CUDA_ERROR_INVALID_VALUE;
  const uintptr_t end = ptr + size;
  uintptr_t cursor = ptr;
  while (cursor < end) {
    Allocation* a = findAllocationLocked(d, cursor);
    if (a == nullptr || a->kind != MemKind::Mapped) return CUDA_ERROR_INVALID_VALUE;
    if (exact && cursor == ptr && a->base != ptr) return CUDA_ERROR_INVALID_VALUE;
    out.push_back(a);
    cursor = a->base + a->size;
  }
  if (exact && cursor != end) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// Reads the device ordinal back from a memfd's name; -1 if the descriptor is
// not one of ours.
int deviceOfVmmFd(int fd) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  char target[256];
  ssize_t n = readlink(path, target, sizeof target - 1);
  if (n <= 0) return -1;
  std::string_view t(target, static_cast<size_t>(n));
  constexpr std::string_view kMemfd = "/memfd:";
  if (!t.starts_with(kMemfd)) return -1;
  t.remove_prefix(kMemfd.size());
  if (!t.starts_with(kVmmMemfdPrefix)) return -1;
  t.remove_prefix(kVmmMemfdPrefix.size());
  int device = 0;
  size_t digits = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits])) && digits < 3) {
    device = device * 10 + (t[digits] - '0');
    ++digits;
  }
  return digits == 0 ? -1 : device;
}

}  // namespace
}  // namespace fakecuda

FAKE_API CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                                CUmemAllocationGranularity_flags option) {
  FAKE_ENTER("cuMemGetAllocationGranularity");
  if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  if (CUresult r = validateAllocationProp(d, prop); r != CUDA_SUCCESS) return r;
  *granularity = kVmmGranularity;
  return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                              unsigned long long flags) {
  FAKE_ENTER("cuMemCreate");
  if (handle == nullptr || flags != 0 || size == 0 || size % kVmmGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    if (CUresult r = validateAllocationProp(d, prop); r != CUDA_SUCCESS) return r;
    auto phys = std::make_shared<PhysAlloc>();
    const std::string name = std::string(kVmmMemfdPrefix) + std::to_string(physicalOf(d, prop->location.id));
    phys->fd = memfd_create(name.c_str(), MFD_CLOEXEC);
    if (phys->fd < 0 || ftruncate(phys->fd, static_cast<off_t>(size)) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    phys->size = size;
    phys->device = prop->location.id;
    phys->prop = *prop;
    const uint64_t id = d.nextHandle++;
    d.handles.emplace(id, HandleEntry{std::move(phys), 1});
    *handle = id;
    return CUDA_SUCCESS;
  });
}

// The memory itself lives on while a mapping still uses it, as in CUDA.
FAKE_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FAKE_ENTER("cuMemRelease");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto it = d.handles.find(handle);
    if (it == d.handles.end()) return CUDA_ERROR_INVALID_VALUE;
    if (--it->second.refs == 0) d.handles.erase(it);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                      unsigned long long flags) {
  FAKE_ENTER("cuMemAddressReserve");
  if (ptr == nullptr || flags != 0 || size == 0 || size % kVmmGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  if ((alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  alignment = std::max(alignment, kVmmGranularity);
  if (size > SIZE_MAX - alignment) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    constexpr int kReserveFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    void* base = MAP_FAILED;
    if (addr != 0 && addr % alignment == 0) {  // a hint, honoured when free
      base = mmap(reinterpret_cast<void*>(addr), size, PROT_NONE, kReserveFlags | MAP_FIXED_NOREPLACE, -1, 0);
    }
    if (base == MAP_FAILED) {
      const size_t span = size + alignment;
      void* raw = mmap(nullptr, span, PROT_NONE, kReserveFlags, -1, 0);
      if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
      const uintptr_t r = reinterpret_cast<uintptr_t>(raw);
      const uintptr_t aligned = roundUp(r, alignment);
      if (aligned > r) munmap(raw, aligned - r);
      if (r + span > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), r + span - (aligned + size));
      base = reinterpret_cast<void*>(aligned);
    }
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    d.reservations.emplace(reinterpret_cast<uintptr_t>(base), size);
    *ptr = reinterpret_cast<uintptr_t>(base);
    return CUDA_SUCCESS;
  });
}

// Refused while something is still mapped inside: cuMemUnmap comes first.
FAKE_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER("cuMemAddressFree");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto it = d.reservations.find(static_cast<uintptr_t>(ptr));
    if (it == d.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
    auto inside = d.allocations.lower_bound(static_cast<uintptr_t>(ptr));
    if (inside != d.allocations.end() && inside->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
    munmap(reinterpret_cast<void*>(ptr), size);
    d.reservations.erase(it);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                           unsigned long long flags) {
  FAKE_ENTER("cuMemMap");
  if (offset != 0 || flags != 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;  // cuda.h: offset must be 0
  if (ptr % kVmmGranularity != 0 || size % kVmmGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto h = d.handles.find(handle);
    if (h == d.handles.end()) return CUDA_ERROR_INVALID_HANDLE;
    std::shared_ptr<PhysAlloc> phys = h->second.phys;
    if (size > phys->size) return CUDA_ERROR_INVALID_VALUE;
    uintptr_t rangeBase = 0;
    size_t rangeSize = 0;
    if (!inReservationLocked(d, ptr, &rangeBase, &rangeSize) || ptr + size > rangeBase + rangeSize) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto next = d.allocations.lower_bound(static_cast<uintptr_t>(ptr));
    if (findAllocationLocked(d, ptr) != nullptr || (next != d.allocations.end() && next->first < ptr + size)) {
      return CUDA_ERROR_INVALID_VALUE;  // already mapped
    }
    void* user = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, phys->fd, 0);
    if (user == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    void* alias = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, phys->fd, 0);
    if (alias == MAP_FAILED) {
      restoreReservation(ptr, size);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    auto backing = std::make_shared<Backing>();
    backing->addr = alias;
    backing->len = size;
    backing->owner = phys;
    Allocation a;
    a.base = static_cast<uintptr_t>(ptr);
    a.size = size;
    a.mappedLen = size;
    a.kind = MemKind::Mapped;
    a.device = phys->device;
    a.ctx = validDevice(d, phys->device) ? d.contexts[static_cast<size_t>(phys->device)].get() : nullptr;
    a.alias = static_cast<char*>(alias);
    a.backing = std::move(backing);
    a.rangeBase = rangeBase;
    a.rangeSize = rangeSize;
    a.physHandle = handle;
    a.phys = phys;
    a.allowedHandleTypes = static_cast<uint64_t>(phys->prop.requestedHandleTypes);
    addAllocationLocked(d, std::move(a));
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER("cuMemUnmap");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    std::vector<Allocation*> maps;
    if (CUresult r = mappingsCoveringLocked(d, ptr, size, true, maps); r != CUDA_SUCCESS) return r;
    for (Allocation* a : maps) {
      const uintptr_t base = a->base;
      restoreReservation(base, a->mappedLen);
      d.allocations.erase(base);  // the alias goes with the last queued user
    }
    return CUDA_SUCCESS;
  });
}

// Records who may access the range; the caller's host view stays PROT_NONE.
FAKE_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  FAKE_ENTER("cuMemSetAccess");
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    for (size_t i = 0; i < count; ++i) {
      if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
      if (!validDevice(d, desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
      const CUmemAccess_flags f = desc[i].flags;
      if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    std::vector<Allocation*> maps;
    if (CUresult r = mappingsCoveringLocked(d, ptr, size, false, maps); r != CUDA_SUCCESS) return r;
    for (Allocation* a : maps) {
      for (size_t i = 0; i < count; ++i) a->access[desc[i].location.id] = desc[i].flags;
    }
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  FAKE_ENTER("cuMemGetAccess");
  if (flags == nullptr || location == nullptr || location->type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  Allocation* a = findAllocationLocked(d, ptr);
  if (a == nullptr || a->kind != MemKind::Mapped) return CUDA_ERROR_INVALID_VALUE;
  auto it = a->access.find(location->id);
  *flags = it == a->access.end() ? CU_MEM_ACCESS_FLAGS_PROT_NONE : it->second;
  return CUDA_SUCCESS;
}

// POSIX descriptors only: writes a new descriptor of the memfd to *(int*).
FAKE_API CUresult cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                               CUmemAllocationHandleType handleType, unsigned long long flags) {
  FAKE_ENTER("cuMemExportToShareableHandle");
  if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto it = d.handles.find(handle);
    if (it == d.handles.end()) return CUDA_ERROR_INVALID_VALUE;
    const PhysAlloc& phys = *it->second.phys;
    if ((phys.prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
      return CUDA_ERROR_INVALID_VALUE;  // not requested at cuMemCreate
    }
    int fd = dup(phys.fd);
    if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
    *static_cast<int*>(shareableHandle) = fd;
    return CUDA_SUCCESS;
  });
}

// The descriptor (passed as (void*)(uintptr_t)fd, as cuda.h's samples do) may
// come from another process over SCM_RIGHTS; the caller keeps ownership of it.
FAKE_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                                 CUmemAllocationHandleType shHandleType) {
  FAKE_ENTER("cuMemImportFromShareableHandle");
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  return guarded([&]() -> CUresult {
    const int fd = static_cast<int>(reinterpret_cast<intptr_t>(osHandle));
    struct stat st{};
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) return CUDA_ERROR_INVALID_VALUE;
    const int physical = deviceOfVmmFd(fd);
    if (physical < 0) return CUDA_ERROR_INVALID_VALUE;  // not exported by this stand-in
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    if (physical >= knobs().devices.load()) return CUDA_ERROR_INVALID_VALUE;
    // Memory of a GPU SHOAL_FAKECUDA_VISIBLE_DEVICES hides maps as the real driver's
    // does (peer access: every emulated device has it): no ordinal here.
    const int device = ordinalOfPhysical(d, physical);
    auto phys = std::make_shared<PhysAlloc>();
    phys->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (phys->fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
    phys->size = static_cast<size_t>(st.st_size);
    phys->device = device;
    phys->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    phys->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    phys->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    phys->prop.location.id = device;
    const uint64_t id = d.nextHandle++;
    d.handles.emplace(id, HandleEntry{std::move(phys), 1});
    *handle = id;
    return CUDA_SUCCESS;
  });
}

// The handle of the memory mapped at addr, with one more reference (released
// by cuMemRelease), even if its creator already released it.
FAKE_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  FAKE_ENTER("cuMemRetainAllocationHandle");
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    Allocation* a = findAllocationLocked(d, reinterpret_cast<uintptr_t>(addr));
    if (a == nullptr || a->kind != MemKind::Mapped) return CUDA_ERROR_INVALID_VALUE;
    auto it = d.handles.find(a->physHandle);
    if (it != d.handles.end()) {
      ++it->second.refs;
    } else {
      d.handles.emplace(a->physHandle, HandleEntry{a->phys, 1});
    }
    *handle = a->physHandle;
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  FAKE_ENTER("cuMemGetAllocationPropertiesFromHandle");
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  auto it = d.handles.find(handle);
  if (it == d.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  *prop = it->second.phys->prop;
  return CUDA_SUCCESS;
}

// ===========================================================================
// Modules and the one emulated kernel.

FAKE_API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  FAKE_ENTER("cuModuleLoadData");
  if (captureProhibitsUnsafeCalls()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!knobs().kernels.load()) return CUDA_ERROR_NOT_SUPPORTED;
  return guarded([&]() -> CUresult {
    if (currentContext() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    auto m = std::make_unique<Module>();
    m->ctx = currentContext();
    size_t size = 0;
    if (fatbinSize(image, &size)) {
      m->entries = fatbinEntries(image, size);
    } else {
      m->entries = ptxEntries(static_cast<const char*>(image));
    }
    // Only an image holding a kernel the stand-in can run is accepted.
    if (std::none_of(m->entries.begin(), m->entries.end(), runnableKernel)) return CUDA_ERROR_INVALID_IMAGE;
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    Module* raw = m.get();
    d.modules.emplace(raw, std::move(m));
    *module = reinterpret_cast<CUmodule>(raw);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuModuleUnload(CUmodule hmod) {
  FAKE_ENTER("cuModuleUnload");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto it = d.modules.find(reinterpret_cast<Module*>(hmod));
    if (it == d.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    for (auto& f : it->second->functions) d.functions.erase(f.get());
    d.modules.erase(it);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  FAKE_ENTER("cuModuleGetFunction");
  if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto it = d.modules.find(reinterpret_cast<Module*>(hmod));
    if (it == d.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    Module& m = *it->second;
    // Only a kernel the image holds and the stand-in can run (and not hidden
    // by shoalFakeCudaHideKernel).
    if (std::find(m.entries.begin(), m.entries.end(), name) == m.entries.end() || !runnableKernel(name)) {
      return CUDA_ERROR_NOT_FOUND;
    }
    {
      Knobs& k = knobs();
      std::lock_guard hk(k.hiddenMu);
      if (k.hiddenKernel == name) return CUDA_ERROR_NOT_FOUND;
    }
    for (auto& f : m.functions) {
      if (f->name == name) {
        *hfunc = reinterpret_cast<CUfunction>(f.get());
        return CUDA_SUCCESS;
      }
    }
    auto f = std::make_unique<Function>();
    f->module = &m;
    f->name = name;
    f->reduce = findReduceKernel(name);
    Function* raw = f.get();
    m.functions.push_back(std::move(f));
    d.functions.insert(raw);
    *hfunc = reinterpret_cast<CUfunction>(raw);
    return CUDA_SUCCESS;
  });
}

FAKE_API CUresult cuFuncLoad(CUfunction function) {
  FAKE_ENTER("cuFuncLoad");
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    // Nothing loads lazily here: a function cuModuleGetFunction returned is loaded.
    return d.functions.count(reinterpret_cast<Function*>(function)) != 0 ? CUDA_SUCCESS
                                                                         : CUDA_ERROR_INVALID_HANDLE;
  });
}

FAKE_API CUresult cuFuncIsLoaded(CUfunctionLoadingState* state, CUfunction function) {
  FAKE_ENTER("cuFuncIsLoaded");
  if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guarded([&]() -> CUresult {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    if (d.functions.count(reinterpret_cast<Function*>(function)) == 0) return CUDA_ERROR_INVALID_HANDLE;
    *state = CU_FUNCTION_LOADING_STATE_LOADED;
    return CUDA_SUCCESS;
  });
}

// A reduction kernel (ReduceKernel above). Requires d.mu. Bad launches fail
// here rather than as a fault later: more than the kernels' 512 threads per
// block, an element misaligned (CUDA_ERROR_MISALIGNED_ADDRESS), memory CUDA
// does not know or past an allocation's end (CUDA_ERROR_ILLEGAL_ADDRESS), and
// integer avg by 0 (CUDA_ERROR_INVALID_VALUE; a GPU would give unspecified values).
// Reduction kernel launches per device (shoalFakeCudaReduceLaunchesOn).
std::atomic<unsigned long long> gReduceLaunches[kMaxDevices];

// A kernel runs in the context its module was loaded in: a stream of
// another context (another GPU's) is refused, as the driver refuses it.
CUresult launchStreamLocked(Driver& d, const Function& fn, CUstream hStream, std::shared_ptr<Stream>& out) {
  if (CUresult r = resolveStreamLocked(d, hStream, out); r != CUDA_SUCCESS) return r;
  return fn.module->ctx == out->ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult launchReduceLocked(Driver& d, const Function& fn, unsigned threads, CUstream hStream,
                            void** kernelParams) {
  const ReduceKernel& k = *fn.reduce;
  for (int i = 0; i < kReduceParams; ++i)
    if (kernelParams[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (threads > kReduceMaxThreads) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr dst = 0, a = 0, b = 0, scalar = 0;
  uint64_t count = 0, bits = 0;
  std::memcpy(&dst, kernelParams[0], sizeof dst);
  std::memcpy(&a, kernelParams[1], sizeof a);
  std::memcpy(&b, kernelParams[2], sizeof b);
  std::memcpy(&count, kernelParams[3], sizeof count);
  std::memcpy(&scalar, kernelParams[4], sizeof scalar);
  std::memcpy(&bits, kernelParams[5], sizeof bits);
  std::shared_ptr<Stream> s;
  if (CUresult r = launchStreamLocked(d, fn, hStream, s); r != CUDA_SUCCESS) return r;
  const int dev = s->ctx->device;
  if (dev >= 0 && dev < kMaxDevices) gReduceLaunches[dev].fetch_add(1);
  if (count == 0) return CUDA_SUCCESS;  // no thread touches memory
  const size_t size = k.elementSize;
  if (count > SIZE_MAX / size) return CUDA_ERROR_INVALID_VALUE;
  const size_t bytes = count * size;
  if (dst % size != 0 || a % size != 0 || b % size != 0 || scalar % size != 0) {
    return CUDA_ERROR_MISALIGNED_ADDRESS;
  }
  if (k.integerAvg && bits == 0) return CUDA_ERROR_INVALID_VALUE;
  View dstView, aView, bView, scalarView;
  struct Operand {
    CUdeviceptr addr;
    size_t bytes;
    bool write;
    View* view;
  };
  for (const Operand& o : {Operand{dst, bytes, true, &dstView}, Operand{a, bytes, false, &aView},
                           Operand{b, bytes, false, &bView}, Operand{scalar, size, false, &scalarView}}) {
    if (o.addr == 0 && o.view == &scalarView) continue;  // the scalar is in scalarBits
    // A kernel reaches only memory CUDA knows: device, managed or pinned.
    if (findAllocationLocked(d, static_cast<uintptr_t>(o.addr)) == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (viewLocked(d, o.addr, o.bytes, dev, o.write, *o.view) != CUDA_SUCCESS) return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  return enqueue(*s, [run = k.run, dstView, aView, bView, scalarView, count, bits] {
    run(dstView.p, aView.p, bView.p, count, scalarView.p, bits);
  });
}

// shoal_wait_u64(const volatile uint64_t* word, uint64_t value,
//                const volatile uint32_t* abortWord):
// the stream waits until (int64_t)(*word - value) >= 0, or *abortWord != 0
// (abortWord may be null). Grid and block shape do not matter.
// The reduction kernels: launchReduceLocked.
FAKE_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                 unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                 unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra) {
  FAKE_ENTER("cuLaunchKernel");
  if (gridDimX == 0 || gridDimY == 0 || gridDimZ == 0 || blockDimX == 0 || blockDimY == 0 || blockDimZ == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  (void)sharedMemBytes;  // nothing runs on an SM, so there is nothing to size
  // Parameters must come as kernelParams (the `extra` buffer form is not emulated).
  if (kernelParams == nullptr || extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  {
    Driver& d = drv();
    std::lock_guard lk(d.mu);
    auto* fn = reinterpret_cast<Function*>(f);
    if (d.functions.count(fn) != 0 && fn->reduce != nullptr) {
      return guarded([&]() -> CUresult {
        return launchReduceLocked(d, *fn, blockDimX * blockDimY * blockDimZ, hStream, kernelParams);
      });
    }
  }
  if (kernelParams[0] == nullptr || kernelParams[1] == nullptr || kernelParams[2] == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return guarded([&]() -> CUresult {
    CUdeviceptr word = 0, abortWord = 0;
    uint64_t value = 0;
    std::memcpy(&word, kernelParams[0], sizeof word);
    std::memcpy(&value, kernelParams[1], sizeof value);
    std::memcpy(&abortWord, kernelParams[2], sizeof abortWord);
    Driver& d = drv();
    std::shared_ptr<Stream> s;
    View wordView, abortView;
    {
      std::lock_guard lk(d.mu);
      if (d.functions.count(reinterpret_cast<Function*>(f)) == 0) return CUDA_ERROR_INVALID_HANDLE;
      if (CUresult r = launchStreamLocked(d, *reinterpret_cast<Function*>(f), hStream, s); r != CUDA_SUCCESS) return r;
      const int dev = s->ctx->device;
      // A misaligned or bad pointer faults the kernel; report it at launch.
      if (word % 8 != 0 || abortWord % 4 != 0) return CUDA_ERROR_MISALIGNED_ADDRESS;
      if (CUresult r = viewLocked(d, word, 8, dev, false, wordView); r != CUDA_SUCCESS) return CUDA_ERROR_ILLEGAL_ADDRESS;
      if (abortWord != 0 && viewLocked(d, abortWord, 4, dev, false, abortView) != CUDA_SUCCESS) {
        return CUDA_ERROR_ILLEGAL_ADDRESS;
      }
    }
    Stream* raw = s.get();
    return enqueue(*s, [raw, wordView, abortView, value] {
      std::atomic_ref<uint64_t> w(*reinterpret_cast<uint64_t*>(wordView.p));
      uint32_t* abortPtr = reinterpret_cast<uint32_t*>(abortView.p);
      pollOnStream(*raw, [&] {
        if (static_cast<int64_t>(w.load(std::memory_order_acquire) - value) >= 0) return true;
        return abortPtr != nullptr && std::atomic_ref<uint32_t>(*abortPtr).load(std::memory_order_acquire) != 0;
      });
    });
  });
}

// ===========================================================================
// Entry points by name.

namespace fakecuda {
namespace {

struct ProcEntry {
  const char* name;     // the base name callers ask for
  void* fn;             // the newest version implemented
  int since = 0;        // the CUDA version that brought it (or this ABI of it), when after 12.0
};

#define FAKE_PROC(base, impl) {#base, reinterpret_cast<void*>(&impl)}
// As the real driver: asked for as of an older CUDA, the symbol is not there
// (CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT).
#define FAKE_PROC_SINCE(base, impl, version) {#base, reinterpret_cast<void*>(&impl), version}
const ProcEntry kProcs[] = {
    FAKE_PROC(cuInit, cuInit),
    FAKE_PROC(cuDriverGetVersion, cuDriverGetVersion),
    FAKE_PROC(cuGetErrorString, cuGetErrorString),
    FAKE_PROC(cuGetErrorName, cuGetErrorName),
    FAKE_PROC(cuGetProcAddress, cuGetProcAddress_v2),
    FAKE_PROC(cuDeviceGetCount, cuDeviceGetCount),
    FAKE_PROC(cuDeviceGet, cuDeviceGet),
    FAKE_PROC(cuDeviceGetName, cuDeviceGetName),
    FAKE_PROC(cuDeviceGetUuid, cuDeviceGetUuid_v2),
    FAKE_PROC(cuDeviceTotalMem, cuDeviceTotalMem_v2),
    FAKE_PROC(cuDeviceGetAttribute, cuDeviceGetAttribute),
    FAKE_PROC(cuDeviceGetPCIBusId, cuDeviceGetPCIBusId),
    FAKE_PROC(cuDeviceCanAccessPeer, cuDeviceCanAccessPeer),
    FAKE_PROC(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain),
    FAKE_PROC(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2),
    FAKE_PROC(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState),
    FAKE_PROC(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2),
    FAKE_PROC(cuCtxSetCurrent, cuCtxSetCurrent),
    FAKE_PROC(cuCtxGetCurrent, cuCtxGetCurrent),
    FAKE_PROC(cuCtxPushCurrent, cuCtxPushCurrent_v2),
    FAKE_PROC(cuCtxPopCurrent, cuCtxPopCurrent_v2),
    FAKE_PROC(cuCtxGetDevice, cuCtxGetDevice),
    FAKE_PROC(cuCtxGetId, cuCtxGetId),
    FAKE_PROC(cuCtxGetStreamPriorityRange, cuCtxGetStreamPriorityRange),
    FAKE_PROC(cuCtxSynchronize, cuCtxSynchronize),
    FAKE_PROC(cuMemAlloc, cuMemAlloc_v2),
    FAKE_PROC(cuMemFree, cuMemFree_v2),
    FAKE_PROC(cuMemAllocAsync, cuMemAllocAsync),
    FAKE_PROC(cuMemFreeAsync, cuMemFreeAsync),
    FAKE_PROC(cuMemAllocManaged, cuMemAllocManaged),
    FAKE_PROC(cuMemGetInfo, cuMemGetInfo_v2),
    FAKE_PROC(cuMemGetAddressRange, cuMemGetAddressRange_v2),
    FAKE_PROC(cuMemHostAlloc, cuMemHostAlloc),
    FAKE_PROC(cuMemAllocHost, cuMemAllocHost_v2),
    FAKE_PROC(cuMemFreeHost, cuMemFreeHost),
    FAKE_PROC(cuMemHostRegister, cuMemHostRegister_v2),
    FAKE_PROC(cuMemHostUnregister, cuMemHostUnregister),
    FAKE_PROC(cuMemHostGetDevicePointer, cuMemHostGetDevicePointer_v2),
    FAKE_PROC(cuMemHostGetFlags, cuMemHostGetFlags),
    FAKE_PROC(cuPointerGetAttribute, cuPointerGetAttribute),
    FAKE_PROC(cuPointerGetAttributes, cuPointerGetAttributes),
    FAKE_PROC(cuMemcpy, cuMemcpy),
    FAKE_PROC(cuMemcpyHtoD, cuMemcpyHtoD_v2),
    FAKE_PROC(cuMemcpyDtoH, cuMemcpyDtoH_v2),
    FAKE_PROC(cuMemcpyDtoD, cuMemcpyDtoD_v2),
    FAKE_PROC(cuMemcpyAsync, cuMemcpyAsync),
    FAKE_PROC(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2),
    FAKE_PROC(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2),
    FAKE_PROC(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2),
    FAKE_PROC(cuMemsetD8, cuMemsetD8_v2),
    FAKE_PROC(cuMemsetD32, cuMemsetD32_v2),
    FAKE_PROC(cuMemsetD8Async, cuMemsetD8Async),
    FAKE_PROC(cuMemsetD32Async, cuMemsetD32Async),
    FAKE_PROC(cuStreamCreate, cuStreamCreate),
    FAKE_PROC(cuStreamCreateWithPriority, cuStreamCreateWithPriority),
    FAKE_PROC(cuStreamDestroy, cuStreamDestroy_v2),
    FAKE_PROC(cuStreamSynchronize, cuStreamSynchronize),
    FAKE_PROC(cuStreamQuery, cuStreamQuery),
    FAKE_PROC(cuStreamGetCtx, cuStreamGetCtx),
    FAKE_PROC(cuStreamGetFlags, cuStreamGetFlags),
    FAKE_PROC(cuStreamGetPriority, cuStreamGetPriority),
    FAKE_PROC(cuStreamWaitEvent, cuStreamWaitEvent),
    FAKE_PROC(cuLaunchHostFunc, cuLaunchHostFunc),
    FAKE_PROC(cuStreamWaitValue32, cuStreamWaitValue32_v2),
    FAKE_PROC(cuStreamWaitValue64, cuStreamWaitValue64_v2),
    FAKE_PROC(cuStreamWriteValue32, cuStreamWriteValue32_v2),
    FAKE_PROC(cuStreamWriteValue64, cuStreamWriteValue64_v2),
    FAKE_PROC(cuStreamBatchMemOp, cuStreamBatchMemOp_v2),
    FAKE_PROC(cuEventCreate, cuEventCreate),
    FAKE_PROC(cuEventDestroy, cuEventDestroy_v2),
    FAKE_PROC(cuEventRecord, cuEventRecord),
    FAKE_PROC(cuEventRecordWithFlags, cuEventRecordWithFlags),
    FAKE_PROC(cuEventQuery, cuEventQuery),
    FAKE_PROC(cuEventSynchronize, cuEventSynchronize),
    FAKE_PROC(cuEventElapsedTime, cuEventElapsedTime_v2),
    FAKE_PROC(cuStreamBeginCapture, cuStreamBeginCapture_v2),
    FAKE_PROC(cuStreamEndCapture, cuStreamEndCapture),
    FAKE_PROC(cuStreamIsCapturing, cuStreamIsCapturing),
    FAKE_PROC_SINCE(cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_v3, 12030),
    FAKE_PROC(cuGraphDestroy, cuGraphDestroy),
    FAKE_PROC(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags),
    FAKE_PROC(cuGraphLaunch, cuGraphLaunch),
    FAKE_PROC(cuGraphExecDestroy, cuGraphExecDestroy),
    FAKE_PROC(cuUserObjectCreate, cuUserObjectCreate),
    FAKE_PROC(cuUserObjectRetain, cuUserObjectRetain),
    FAKE_PROC(cuUserObjectRelease, cuUserObjectRelease),
    FAKE_PROC(cuGraphRetainUserObject, cuGraphRetainUserObject),
    FAKE_PROC(cuThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode),
    FAKE_PROC(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity),
    FAKE_PROC(cuMemCreate, cuMemCreate),
    FAKE_PROC(cuMemRelease, cuMemRelease),
    FAKE_PROC(cuMemAddressReserve, cuMemAddressReserve),
    FAKE_PROC(cuMemAddressFree, cuMemAddressFree),
    FAKE_PROC(cuMemMap, cuMemMap),
    FAKE_PROC(cuMemUnmap, cuMemUnmap),
    FAKE_PROC(cuMemSetAccess, cuMemSetAccess),
    FAKE_PROC(cuMemGetAccess, cuMemGetAccess),
    FAKE_PROC(cuMemExportToShareableHandle, cuMemExportToShareableHandle),
    FAKE_PROC(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle),
    FAKE_PROC(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle),
    FAKE_PROC(cuMemGetAllocationPropertiesFromHandle, cuMemGetAllocationPropertiesFromHandle),
    FAKE_PROC(cuModuleLoadData, cuModuleLoadData),
    FAKE_PROC(cuModuleUnload, cuModuleUnload),
    FAKE_PROC(cuModuleGetFunction, cuModuleGetFunction),
    FAKE_PROC(cuLaunchKernel, cuLaunchKernel),
    FAKE_PROC_SINCE(cuFuncLoad, cuFuncLoad, 12040),
    FAKE_PROC(cuFuncIsLoaded, cuFuncIsLoaded),
};
#undef FAKE_PROC

constexpr cuuint64_t kProcFlags = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
constexpr int kOldestProcVersion = 12000;  // the versions implemented are those of CUDA 12+

CUresult procAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                     CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr || (flags & ~kProcFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  // Default and per-thread lookups answer alike: the stand-in has one default
  // stream per context (see README.md).
  for (const ProcEntry& e : kProcs) {
    if (std::strcmp(e.name, symbol) != 0) continue;
    if (cudaVersion < kOldestProcVersion || cudaVersion < e.since) {
      // An older caller would expect older ABI versions, which are not here.
      if (status != nullptr) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
      return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = e.fn;
    if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

}  // namespace
}  // namespace fakecuda

FAKE_API CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                      CUdriverProcAddressQueryResult* symbolStatus) {
  FAKE_ENTER_NOINIT("cuGetProcAddress");
  return procAddress(symbol, pfn, cudaVersion, flags, symbolStatus);
}

// The unversioned symbol keeps the ABI it has in the real driver (CUDA 11.3's
// four arguments, cudaTypedefs.h PFN_cuGetProcAddress_v11030): a caller that
// passes four arguments must never have a fifth read as a pointer.
// cuda.h makes cuGetProcAddress a macro for the _v2 name; define the plain one.
#pragma push_macro("cuGetProcAddress")
#undef cuGetProcAddress
FAKE_API CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  FAKE_ENTER_NOINIT("cuGetProcAddress");
  return procAddress(symbol, pfn, cudaVersion, flags, nullptr);
}
#pragma pop_macro("cuGetProcAddress")

// ===========================================================================
// NVIDIA's management library, the part Shoal asks (libnvidia-ml.so.1's
// nvml* symbols; tests point SHOAL_NVML_LIBRARY at this library). It sees
// every emulated device of the machine whatever SHOAL_FAKECUDA_VISIBLE_DEVICES says,
// by the UUIDs cuDeviceGetUuid gives them, and reports peer access between
// any two (they share one host, as cuDeviceCanAccessPeer says) unless
// SHOAL_FAKECUDA_NO_PEER_ACCESS=1. Values are
// nvml.h's: NVML_SUCCESS 0, NVML_ERROR_UNINITIALIZED 1,
// NVML_ERROR_INVALID_ARGUMENT 2, NVML_ERROR_NOT_FOUND 6; P2P caps read 0,
// write 1 (all answered alike); NVML_P2P_STATUS_OK 0.

namespace fakecuda {
namespace {
std::atomic<int> gNvmlInits{0};

std::string uuidText(const CUuuid& u) {
  char out[48];
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::snprintf(out, sizeof out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

// Device handles are the machine's index plus one (never null).
int nvmlIndexOf(void* handle) {
  const auto v = reinterpret_cast<uintptr_t>(handle);
  return v >= 1 && v <= static_cast<uintptr_t>(knobs().devices.load()) ? static_cast<int>(v - 1) : -1;
}
}  // namespace
}  // namespace fakecuda

FAKE_API int nvmlInit_v2(void) {
  gNvmlInits.fetch_add(1);
  return 0;
}

FAKE_API int nvmlShutdown(void) {
  int n = gNvmlInits.load();
  while (n > 0 && !gNvmlInits.compare_exchange_weak(n, n - 1)) {
  }
  return n > 0 ? 0 : 1;
}

FAKE_API const char* nvmlErrorString(int result) {
  switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 6: return "Not Found";
    default: return "Unknown Error";
  }
}

FAKE_API int nvmlDeviceGetHandleByUUID(const char* uuid, void** device) {
  if (gNvmlInits.load() == 0) return 1;
  if (uuid == nullptr || device == nullptr) return 2;
  const int count = knobs().devices.load();
  for (int i = 0; i < count; ++i) {
    if (uuidText(deviceUuid(i)) == uuid) {
      *device = reinterpret_cast<void*>(static_cast<uintptr_t>(i) + 1);
      return 0;
    }
  }
  return 6;
}

FAKE_API int nvmlDeviceGetP2PStatus(void* device1, void* device2, int capsIndex, int* status) {
  if (gNvmlInits.load() == 0) return 1;
  if (status == nullptr || nvmlIndexOf(device1) < 0 || nvmlIndexOf(device2) < 0 || capsIndex < 0 || capsIndex > 4)
    return 2;
  *status = knobs().peerAccess.load() ? 0 : 5;  // NVML_P2P_STATUS_NOT_SUPPORTED
  return 0;
}

// ===========================================================================
// Test controls (fake_cuda.h). Not CUDA calls: not counted, never refused.

FAKE_API CUresult shoalFakeCudaStreamDelay(CUstream stream, unsigned ms) {
  return guarded([&]() -> CUresult {
    if (!gInitialized.load()) return CUDA_ERROR_NOT_INITIALIZED;
    std::shared_ptr<Stream> s;
    if (CUresult r = resolveStream(stream, s); r != CUDA_SUCCESS) return r;
    Stream* raw = s.get();
    return enqueue(*s, [raw, ms] { sleepOnStream(*raw, ms); });
  });
}

FAKE_API void shoalFakeCudaSetMemOps(int enabled) { knobs().memops.store(enabled != 0); }

FAKE_API void shoalFakeCudaSetKernels(int enabled) { knobs().kernels.store(enabled != 0); }

FAKE_API void shoalFakeCudaHideKernel(const char* name) {
  Knobs& k = knobs();
  std::lock_guard lk(k.hiddenMu);
  k.hiddenKernel = name != nullptr ? name : "";
}

FAKE_API void shoalFakeCudaSetStreamDelayMs(unsigned ms) { knobs().streamDelayMs.store(ms); }

FAKE_API void shoalFakeCudaSetStrictHostFn(int strict) { knobs().strictHostFn.store(strict != 0); }

FAKE_API int shoalFakeCudaSetDevices(int count) {
  if (count < 0 || count > kMaxDevices) return -1;
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  if (gInitialized.load()) return -1;
  knobs().devices.store(count);
  return 0;
}

FAKE_API void shoalFakeCudaFailNth(const char* name, int n) {
  if (name == nullptr) return;
  ApiCounter& c = counterFor(name);
  c.failAt.store(n <= 0 ? 0 : c.calls.load() + static_cast<uint64_t>(n));
}

FAKE_API unsigned long long shoalFakeCudaCallCount(const char* name) {
  if (name == nullptr) return 0;
  try {
    return counters().calls(name);
  } catch (...) {
    return 0;
  }
}

FAKE_API int shoalFakeCudaLiveEvents(void) {
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  return static_cast<int>(d.events.size());
}

FAKE_API unsigned long long shoalFakeCudaReduceLaunchesOn(int device) {
  return device >= 0 && device < kMaxDevices ? gReduceLaunches[device].load() : 0;
}

FAKE_API int shoalFakeCudaLiveStreams(void) {
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  return static_cast<int>(d.liveStreams.size());
}

FAKE_API int shoalFakeCudaLiveAllocations(void) {
  Driver& d = drv();
  std::lock_guard lk(d.mu);
  return static_cast<int>(d.allocations.size() + d.handles.size() + d.reservations.size());
}

FAKE_API unsigned long long shoalFakeCudaHostFnViolations(void) { return gHostFnViolations.load(); }
