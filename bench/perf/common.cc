// Core of the perf benchmarks: launch, per-rank benchmark loop, checks.
//
// Vocabulary (nccl-tests'):
//   size       bytes of the larger of the send and receive regions (the table's
//              "size" column); count = size / element size
//   shape      the element counts and in-place offsets of one call (BufferShape)
//   iteration  one timed step: -m ops inside one ncclGroupStart/End
//   shift      per-iteration offset of the buffers within the allocation, so
//              that consecutive ops touch different memory (catches stale
//              pointer caching)
//   check      one untimed op on fresh verifiable data, then a comparison
//
// Memory (--memory): host memory from ncclMemAlloc with the NULL stream, where
// every call has completed when it returns; or CUDA device memory, where each
// rank thread binds a device (RankDevice) before it makes its communicator,
// so that ncclMemAlloc returns device memory and the communicator is a device
// one, and passes its stream to every call. Device buffers are never touched
// by host code: data goes through host vectors and synchronous copies, and
// the stream is synchronized before the clock is read at the end of a timed
// loop, before data is checked and before the barriers between phases.
//
// Threads: the main thread parses flags, prints the preamble and starts one
// RankRunner thread per local rank; each runner owns its communicator,
// buffers and device binding. Global rank 0's runner prints the table rows.
#include "common.h"

#include <libgen.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "device.h"
#include "options.h"
#include "report.h"
#include "world.h"

namespace shoal::perf {
namespace {

using Clock = std::chrono::steady_clock;

// Any NCCL error ends the whole job: the other ranks would otherwise wait
// forever in the collective this rank left.
void checkNccl(ncclResult_t result, const char* call, const char* file, int line) {
  if (result == ncclSuccess) return;
  const char* lastError = ncclGetLastError(nullptr);
  const char* slash = std::strrchr(file, '/');
  std::printf("%s: Test NCCL failure %s:%d '%s / %s' in %s\n", shortHostName().c_str(),
              slash ? slash + 1 : file, line, ncclGetErrorString(result),
              lastError ? lastError : "", call);
  Process::abortJob(2);
}
#define NCCL_OK(call) checkNccl((call), #call, __FILE__, __LINE__)

// -T: ends the job when no rank has finished an operation for too long.
class Watchdog {
 public:
  explicit Watchdog(int timeoutSeconds) : timeout_(timeoutSeconds) {
    if (timeout_ <= 0) return;
    thread_ = std::thread([this] { watch(); });
  }
  ~Watchdog() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Called after every operation: a plain relaxed store, no clock read, so
  // that the small-message figures time the library, not the watchdog.
  void progress() { completed_.store(completed_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }

 private:
  void watch() {
    std::unique_lock lock(mutex_);
    uint64_t seen = completed_.load(std::memory_order_relaxed);
    Clock::time_point lastChange = Clock::now();
    while (!wake_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping_; })) {
      const uint64_t now = completed_.load(std::memory_order_relaxed);
      if (now != seen) {
        seen = now;
        lastChange = Clock::now();
        continue;
      }
      if (Clock::now() - lastChange > std::chrono::seconds(timeout_)) {
        std::printf("%s: Test timeout (%ds): no NCCL operation completed, aborting\n",
                    shortHostName().c_str(), timeout_);
        Process::abortJob(3);
      }
    }
  }

  const int timeout_;
  std::atomic<uint64_t> completed_{0};  // operations finished by any rank thread
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

// Where this process's ranks keep their buffers, as every process agreed.
struct MemoryPlan {
  bool device = false;
  std::vector<int> devices;  // CUDA device of each local rank thread; -1: host memory
  std::string line;          // "# Memory: ..." for the preamble (process 0's)
};

// What every rank thread of this process shares.
struct RunContext {
  const Options& options;
  const CollectiveSpec& spec;
  World& world;
  ncclUniqueId uniqueId;
  int ncclVersion;
  Report* report;  // global rank 0 only
  Watchdog& watchdog;
  const MemoryPlan& memory;
};

// The byte sizes of one call.
struct CallSizes {
  BufferShape shape;
  size_t eltSize;

  size_t sendBytes() const { return shape.sendCount * eltSize; }
  size_t recvBytes() const { return shape.recvCount * eltSize; }
  size_t paramBytes() const { return shape.paramCount * eltSize; }
  size_t largerBytes() const { return std::max(sendBytes(), recvBytes()); }
};

class RankRunner {
 public:
  RankRunner(const RunContext& context, int thread)
      : ctx_(context),
        options_(context.options),
        spec_(context.spec),
        thread_(thread),
        rank_(context.world.globalRank(thread)),
        nranks_(context.world.rankCount()) {}

  void run() {
    // The context must be current before the communicator is made: that
    // makes it a device communicator, and ncclMemAlloc return device memory.
    if (ctx_.memory.device) {
      device_ = std::make_unique<RankDevice>(ctx_.memory.devices[static_cast<size_t>(thread_)],
                                             options_.streamNull);
    }
    initCommunicator();
    allocateBuffers();
    for (ncclDataType_t type : options_.types) {
      for (Op op : operators()) {
        for (int root : roots()) timeTest(type, op, root);
      }
    }
    completeOps();
    freeBuffers();
    NCCL_OK(ncclCommDestroy(comm_));
    device_.reset();
  }

  // Checks of this rank that found a wrong element (the footer's count).
  int64_t failedChecks() const { return failedChecks_; }

 private:
  std::vector<Op> operators() const {
    return spec_.reduces ? options_.ops : std::vector<Op>{Op::kNone};
  }

  std::vector<int> roots() const {
    if (!spec_.rooted) return {-1};
    if (options_.root >= 0) return {options_.root};
    std::vector<int> all(static_cast<size_t>(nranks_));
    for (int r = 0; r < nranks_; ++r) all[static_cast<size_t>(r)] = r;
    return all;
  }

  bool isPrinter() const { return ctx_.report != nullptr; }

  // ---- Setup, always inside a group as nccl-tests does ----------------------

  void initCommunicator() {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.nvlinkCentricSched = 1;  // nccl-tests sets it; the library must accept it
    if (options_.ctaPolicy >= 0) config.CTAPolicy = options_.ctaPolicy;
    if (spec_.configure) spec_.configure(&config);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclCommInitRankConfig(&comm_, nranks_, ctx_.uniqueId, rank_, &config));
    NCCL_OK(ncclGroupEnd());

    int count = 0, rank = -1;
    NCCL_OK(ncclCommCount(comm_, &count));
    NCCL_OK(ncclCommUserRank(comm_, &rank));
    if (count != nranks_ || rank != rank_) {
      std::printf("rank %d: communicator reports rank %d of %d, expected %d of %d\n", rank_, rank,
                  count, rank_, nranks_);
      Process::abortJob(2);
    }
    if (device_) {
      int cudaDevice = -1;
      NCCL_OK(ncclCommCuDevice(comm_, &cudaDevice));
      if (cudaDevice != device_->ordinal()) {
        std::printf("rank %d: the communicator is on CUDA device %d, expected %d (is the library "
                    "built with CUDA?)\n",
                    rank_, cudaDevice, device_->ordinal());
        Process::abortJob(2);
      }
    }
    ctx_.watchdog.progress();
  }

  void allocateBuffers() {
    // Shifted iterations stay within maxBytes; -u adds up to 8-byte elements.
    bufferBytes_ = options_.maxBytes + static_cast<size_t>(options_.unalign) * 8 + 1;
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclMemAlloc(reinterpret_cast<void**>(&send_), bufferBytes_));
    NCCL_OK(ncclMemAlloc(reinterpret_cast<void**>(&recv_), bufferBytes_));
    if (options_.registerBuffers == 1) {
      NCCL_OK(ncclCommRegister(comm_, send_, bufferBytes_, &sendHandle_));
      NCCL_OK(ncclCommRegister(comm_, recv_, bufferBytes_, &recvHandle_));
    } else if (options_.registerBuffers == 2) {  // collective: every rank registers at the group's end
      NCCL_OK(ncclCommWindowRegister(comm_, send_, bufferBytes_, &sendWindow_, NCCL_WIN_COLL_SYMMETRIC));
      NCCL_OK(ncclCommWindowRegister(comm_, recv_, bufferBytes_, &recvWindow_, NCCL_WIN_COLL_SYMMETRIC));
    }
    NCCL_OK(ncclGroupEnd());
    // Defined contents, so that unchecked runs do not reduce NaNs or
    // denormals, which would time differently.
    fillBytes(send_, 0, bufferBytes_);
    fillBytes(recv_, 0, bufferBytes_);
  }

  // ---- Buffer contents, in either memory ------------------------------------

  void fillBytes(char* p, unsigned char value, size_t bytes) {
    if (device_) {
      device_->fill(p, value, bytes);
    } else {
      std::memset(p, value, bytes);
    }
  }

  // Waits until this rank's operations so far have completed: stream order
  // in device memory; host-memory calls have completed when they return.
  void completeOps() {
    if (device_) device_->synchronize();
  }

  void freeBuffers() {
    if (options_.registerBuffers == 1) {
      NCCL_OK(ncclGroupStart());
      NCCL_OK(ncclCommDeregister(comm_, sendHandle_));
      NCCL_OK(ncclCommDeregister(comm_, recvHandle_));
      NCCL_OK(ncclGroupEnd());
    } else if (options_.registerBuffers == 2) {
      NCCL_OK(ncclCommWindowDeregister(comm_, sendWindow_));
      NCCL_OK(ncclCommWindowDeregister(comm_, recvWindow_));
    }
    NCCL_OK(ncclMemFree(send_));
    NCCL_OK(ncclMemFree(recv_));
  }

  // ---- One operation --------------------------------------------------------

  CallSizes sizesFor(size_t size, ncclDataType_t type) const {
    const size_t eltSize = typeInfo(type).size;
    return CallSizes{spec_.shape(size / eltSize, eltSize, nranks_), eltSize};
  }

  // Start of the region the iteration-0 op reads (in) or writes (out).
  char* regionBase(char* buffer, const CallSizes& sizes) const {
    return buffer + static_cast<size_t>(options_.unalign) * sizes.eltSize;
  }
  size_t inPlaceSendOffset(const CallSizes& s) const {
    return s.shape.sendInPlaceOffset * s.eltSize * static_cast<size_t>(rank_);
  }
  size_t inPlaceRecvOffset(const CallSizes& s) const {
    return s.shape.recvInPlaceOffset * s.eltSize * static_cast<size_t>(rank_);
  }

  // What every call of one size, type, operator and placement shares, worked
  // out once: the timed loop only picks the buffer window and launches.
  struct CallSite {
    LaunchArgs args;        // window 0; a MulSum call creates its op per call
    size_t windowBytes = 0; // call i uses window i mod windows, as nccl-tests does
    size_t windows = 1;
    Op op = Op::kNone;
  };

  CallSite callSite(const CallSizes& sizes, ncclDataType_t type, Op op, int root, bool inPlace) const {
    CallSite site;
    site.windowBytes = sizes.largerBytes();
    site.windows = site.windowBytes ? std::max<size_t>(options_.maxBytes / site.windowBytes, 1) : 1;
    site.op = op;
    char* sendBase = regionBase(send_, sizes);
    char* recvBase = regionBase(recv_, sizes);
    site.args = LaunchArgs{
        .sendbuff = inPlace ? recvBase + inPlaceSendOffset(sizes) : sendBase,
        .recvbuff = inPlace ? recvBase + inPlaceRecvOffset(sizes) : recvBase,
        .count = sizes.shape.paramCount,
        .type = type,
        .op = op == Op::kNone ? ncclSum : builtinRedOp(op),
        .root = root,
        .rank = rank_,
        .nranks = nranks_,
        .ncclVersion = ctx_.ncclVersion,
        .comm = comm_,
        .stream = device_ ? device_->stream() : static_cast<cudaStream_t>(nullptr),
    };
    return site;
  }

  void launch(const CallSite& site, size_t window) {
    LaunchArgs args = site.args;
    const size_t shift = site.windowBytes * window;
    args.sendbuff = static_cast<const char*>(args.sendbuff) + shift;
    args.recvbuff = static_cast<char*>(args.recvbuff) + shift;
    if (site.op == Op::kMulSum) {
      // Created and destroyed around every call, as nccl-tests does, so the
      // library must let an op go right after the call that uses it returns.
      uint64_t scalar = preMulScalarBits(args.type, rank_);
      NCCL_OK(ncclRedOpCreatePreMulSum(&args.op, &scalar, args.type, ncclScalarHostImmediate, comm_));
    }
    checkNccl(spec_.launch(args), spec_.name, __FILE__, __LINE__);
    if (site.op == Op::kMulSum) NCCL_OK(ncclRedOpDestroy(args.op, comm_));

    // -z 1 and 2 wait for the op (a host-memory op on the NULL stream has
    // completed by now); -z 1 adds the barrier.
    if (options_.blocking == 1 || options_.blocking == 2) completeOps();
    if (options_.blocking == 1) ctx_.world.barrier(thread_);
    ctx_.watchdog.progress();
  }

  void startOp(const CallSizes& sizes, ncclDataType_t type, Op op, int root, bool inPlace,
               int iteration) {
    const CallSite site = callSite(sizes, type, op, root, inPlace);
    launch(site, static_cast<size_t>(iteration) % site.windows);
  }

  // Call after completeOps(): an error of stream-ordered work is reported
  // here, as nccl-tests polls for it while it waits.
  void checkAsyncError() {
    ncclResult_t asyncError = ncclSuccess;
    NCCL_OK(ncclCommGetAsyncError(comm_, &asyncError));
    NCCL_OK(asyncError);
  }

  // ---- Data -----------------------------------------------------------------

  bool receivesResult(int root) const { return !spec_.onlyRootReceives || rank_ == root; }

  // Poisons the receive region, writes this rank's input where the op reads
  // it, and computes the expected receive region. In device memory the input
  // is made in a host vector and copied to the same place on the device.
  DataPattern prepareData(const CallSizes& sizes, ncclDataType_t type, Op op, int root,
                          bool inPlace, uint64_t seed, bool withExpected) {
    DataPattern pattern(type, op, nranks_, seed);
    char* recvRegion = regionBase(recv_, sizes) + (inPlace ? inPlaceRecvOffset(sizes) : 0);
    constexpr unsigned char kPoison = 0xa5;  // never produced by the patterns' small values
    fillBytes(recvRegion, kPoison, sizes.recvBytes());
    char* input = inPlace ? regionBase(recv_, sizes) + inPlaceSendOffset(sizes)
                          : regionBase(send_, sizes);
    if (device_) {
      hostMirror_.resize(std::max(hostMirror_.size(), sizes.sendBytes()));
      pattern.writeInput(hostMirror_.data(), rank_, sizes.shape.sendCount);
      device_->copyToDevice(input, hostMirror_.data(), sizes.sendBytes());
    } else {
      pattern.writeInput(input, rank_, sizes.shape.sendCount);
    }
    if (withExpected && receivesResult(root)) {
      expected_.resize(sizes.recvBytes());
      pattern.writeExpected(expected_.data(), sizes.shape.recvCount, [&](size_t k) {
        return spec_.source(rank_, k, sizes.shape.paramCount, nranks_, root);
      });
    }
    ctx_.watchdog.progress();  // large expected regions take a while
    return pattern;
  }

  // Call after completeOps().
  int64_t countWrong(const DataPattern& pattern, const CallSizes& sizes, int root, bool inPlace) {
    if (!receivesResult(root)) return 0;
    const char* recvRegion = regionBase(recv_, sizes) + (inPlace ? inPlaceRecvOffset(sizes) : 0);
    if (device_) {
      hostMirror_.resize(std::max(hostMirror_.size(), sizes.recvBytes()));
      device_->copyToHost(hostMirror_.data(), recvRegion, sizes.recvBytes());
      recvRegion = hostMirror_.data();
    }
    return static_cast<int64_t>(
        pattern.countMismatches(recvRegion, expected_.data(), sizes.shape.recvCount));
  }

  // ---- Benchmark ------------------------------------------------------------

  void timeTest(ncclDataType_t type, Op op, int root) {
    ctx_.world.barrier(thread_);

    // Warm-up at every power-of-two step of the range.
    for (size_t size = options_.minBytes; size <= options_.maxBytes;) {
      const CallSizes sizes = sizesFor(size, type);
      for (int w = 0; w < options_.warmupIters; ++w) startOp(sizes, type, op, root, false, w);
      const size_t next = size ? size * 2 : 1;
      if (next <= size) break;
      size = next;
    }
    completeOps();
    checkAsyncError();

    const char* typeName = typeInfo(type).name;
    const char* opName = opInfo(op).name;
    for (int cycle = 0; options_.runCycles == 0 || cycle < options_.runCycles; ++cycle) {
      for (size_t size = options_.minBytes; size <= options_.maxBytes;) {
        const CallSizes sizes = sizesFor(size, type);
        if (isPrinter()) {
          ctx_.report->beginRow(sizes.largerBytes(), sizes.shape.paramCount, typeName, opName,
                                spec_.rooted ? root : -1);
        }
        benchTime(sizes, type, op, root, /*inPlace=*/false);
        benchTime(sizes, type, op, root, /*inPlace=*/true);
        if (isPrinter()) ctx_.report->endRow();
        if (!nextSize(&size)) break;
      }
    }
  }

  bool nextSize(size_t* size) const {
    size_t next = options_.stepFactor > 1 ? *size * options_.stepFactor : *size + options_.stepBytes;
    if (options_.stepFactor > 1 && *size == 0) next = 1;  // 0 * factor would never grow
    const bool overflowed = options_.stepFactor > 1 && *size != 0 && next / options_.stepFactor != *size;
    if (overflowed || next <= *size) return false;
    *size = next;
    return true;
  }

  // One timed iteration: -m calls, in a group when more than one.
  void issueIteration(const CallSite& site, size_t& window) {
    if (options_.aggIters > 1) NCCL_OK(ncclGroupStart());
    for (int a = 0; a < options_.aggIters; ++a) {
      launch(site, window);
      if (++window == site.windows) window = 0;
    }
    if (options_.aggIters > 1) NCCL_OK(ncclGroupEnd());
  }
  void issueTimedCalls(const CallSite& site, size_t& window) {
    for (int iter = 0; iter < options_.iters; ++iter) issueIteration(site, window);
  }

  void benchTime(const CallSizes& sizes, ncclDataType_t type, Op op, int root, bool inPlace) {
    World& world = ctx_.world;
    if (options_.check) prepareData(sizes, type, op, root, inPlace, /*seed=*/0, false);

    // One untimed op, so that connections and plans exist before timing.
    startOp(sizes, type, op, root, inPlace, 0);
    completeOps();
    checkAsyncError();
    world.barrier(thread_);

    const CallSite site = callSite(sizes, type, op, root, inPlace);
    size_t window = 0;  // (iter * aggIters + a) mod windows, without a division per call
    Clock::duration elapsed{};     // until the ops completed
    Clock::duration cpuElapsed{};  // until the calls returned (-C)
    if (options_.graphLaunches > 0) {
      // -G: the timed calls captured once, then the graph launched -G times
      // (as nccl-tests: the time is divided by the launches too).
      device_->captureGraph([&] { issueTimedCalls(site, window); });
      Clock::time_point start = Clock::now();
      for (int g = 0; g < options_.graphLaunches; ++g) device_->launchGraph();
      cpuElapsed = Clock::now() - start;
      completeOps();
      elapsed = Clock::now() - start;
      device_->dropGraph();
    } else {
      Clock::time_point start = Clock::now();
      for (int iter = 0; iter < options_.iters; ++iter) {
        issueIteration(site, window);
        if (options_.blocking == 3) {
          // The per-iteration barrier is not part of the measured time.
          cpuElapsed += Clock::now() - start;
          completeOps();
          elapsed += Clock::now() - start;
          world.barrier(thread_);
          start = Clock::now();
        }
      }
      cpuElapsed += Clock::now() - start;
      completeOps();
      elapsed += Clock::now() - start;
    }
    checkAsyncError();

    const double ops =
        static_cast<double>(options_.iters) * options_.aggIters * std::max(options_.graphLaunches, 1);
    const double mySeconds =
        std::chrono::duration<double>(options_.reportCpuTime ? cpuElapsed : elapsed).count() / ops;
    const double seconds = world.combineTime(thread_, mySeconds, options_.average);
    Measurement m;
    m.timeUs = seconds * 1e6;
    if (seconds > 0) {
      m.algBw = spec_.algBytes(static_cast<double>(sizes.paramBytes()), nranks_) / 1e9 / seconds;
      m.busBw = m.algBw * spec_.busBwFactor(nranks_);
    }
    world.barrier(thread_);

    const bool reportErrors = options_.check > 0 && (!inPlace || spec_.checksInPlace);
    if (reportErrors) {
      int64_t wrong = 0;
      for (int c = 0; c < options_.check; ++c) {
        // Every rank makes the same sequence of seeds.
        const DataPattern pattern =
            prepareData(sizes, type, op, root, inPlace, ++checkSeed_, true);
        startOp(sizes, type, op, root, inPlace, 0);
        completeOps();
        checkAsyncError();
        const int64_t mine = countWrong(pattern, sizes, root, inPlace);
        if (mine) ++failedChecks_;
        wrong = world.sum(thread_, mine);
        if (wrong) break;
      }
      m.wrong = wrong;
    }
    if (isPrinter()) ctx_.report->addMeasurement(inPlace, m);
  }

  const RunContext& ctx_;
  const Options& options_;
  const CollectiveSpec& spec_;
  const int thread_;
  const int rank_;
  const int nranks_;
  std::unique_ptr<RankDevice> device_;  // device memory only
  std::vector<char> hostMirror_;      // device memory: host side of the copies
  ncclComm_t comm_ = nullptr;
  char* send_ = nullptr;
  char* recv_ = nullptr;
  size_t bufferBytes_ = 0;
  void* sendHandle_ = nullptr;
  void* recvHandle_ = nullptr;
  ncclWindow_t sendWindow_ = nullptr;  // -R 2
  ncclWindow_t recvWindow_ = nullptr;
  std::vector<char> expected_;
  uint64_t checkSeed_ = 0;
  int64_t failedChecks_ = 0;
};

// Decides where this process's ranks keep their buffers (--memory) and on
// which device each rank is, then checks that every process agrees. Empty
// (after process 0 printed why) when the job cannot run. Loads CUDA unless
// the memory is host memory.
std::optional<MemoryPlan> planMemory(const Options& options, const Process& process,
                                     const World& world) {
  MemoryPlan plan;
  std::string error;      // this process cannot run as asked
  std::string noDevice;   // why "auto" means host memory here
  if (options.memory != MemoryMode::kHost) {
    std::string problem = loadDriver();
    if (problem.empty() && deviceCount() < 1) problem = driverPath() + " reports no CUDA device";
    if (problem.empty()) {
      plan.device = true;
    } else if (options.memory == MemoryMode::kDevice) {
      error = "--memory device: no usable CUDA device: " + problem;
    } else {
      noDevice = problem;
    }
  }

  plan.devices.assign(static_cast<size_t>(options.threads), -1);
  if (plan.device) {
    const int count = deviceCount();
    // nccl-tests' NCCL_TESTS_DEVICE puts every rank on one device.
    int only = -1;
    if (const char* text = std::getenv("NCCL_TESTS_DEVICE")) {
      errno = 0;
      char* end = nullptr;
      const long value = std::strtol(text, &end, 10);
      if (errno != 0 || end == text || *end != '\0' || value < 0 || value >= count) {
        error = "NCCL_TESTS_DEVICE=" + std::string(text) + ": not one of the " +
                std::to_string(count) + " CUDA device(s) this process sees";
      }
      only = static_cast<int>(value);
    }
    for (int t = 0; t < options.threads; ++t) {
      plan.devices[static_cast<size_t>(t)] = only >= 0 ? only : world.globalRank(t) % count;
    }
    // Ranks of one process on one device share its NULL stream: the first
    // rank's collective would hold the stream while it waits for the
    // second's, queued behind it.
    std::vector<int> sorted = plan.devices;
    std::sort(sorted.begin(), sorted.end());
    const auto shared = std::adjacent_find(sorted.begin(), sorted.end());
    if (options.streamNull && error.empty() && shared != sorted.end()) {
      error = "-y 1: several ranks of one process on CUDA device " + std::to_string(*shared) +
              " would share its NULL stream and wait for each other forever; use -y 0, more "
              "devices, or one rank per process (--procs)";
    }
  }

  // Every process stops, or none: the others would wait for it forever.
  const std::string errors = process.gatherText(error.empty() ? std::string() : error + "\n");
  if (process.sumOverProcesses(error.empty() ? 0 : 1) != 0) {
    std::set<std::string> seen;  // the same reason once, not once per process
    std::istringstream lines(errors);
    for (std::string line; std::getline(lines, line);) {
      if (seen.insert(line).second) std::printf("%s\n", line.c_str());
    }
    return std::nullopt;
  }
  // Host and device communicators in one job would not match.
  const int64_t onDevice = process.sumOverProcesses(plan.device ? 1 : 0);
  if (onDevice != 0 && onDevice != process.count()) {
    if (process.isMain()) {
      std::printf("--memory auto: %lld of %d processes found a CUDA device, the others did not; "
                  "choose with --memory host or --memory device\n",
                  static_cast<long long>(onDevice), process.count());
    }
    return std::nullopt;
  }

  if (options.graphLaunches > 0 && !plan.device) {
    if (process.isMain()) std::printf("-G captures calls on device memory: %s\n", noDevice.c_str());
    return std::nullopt;
  }
  const char* chosen = options.memory == MemoryMode::kAuto ? " (auto)" : "";
  if (plan.device) {
    plan.line = "# Memory: device" + std::string(chosen) + ", CUDA driver " + driverPath() + ", " +
                std::to_string(deviceCount()) + " device(s), " +
                (options.streamNull ? "the NULL stream (-y 1)" : "one non-blocking stream per rank");
  } else if (options.memory == MemoryMode::kAuto) {
    plan.line = "# Memory: host (auto: " + noDevice + ")";
  } else {
    plan.line = "# Memory: host";
  }
  return plan;
}

}  // namespace

int runPerf(int argc, char** argv, const CollectiveSpec& spec) {
  setlinebuf(stdout);
  // First of all: --procs forks here, before anything calls NCCL or CUDA.
  const Process process = Process::init(&argc, &argv, procsInArgs(argc, argv));

  int ncclVersion = 0;
  NCCL_OK(ncclGetVersion(&ncclVersion));
  const ParseResult parsed = parseOptions(argc, argv, ncclVersion, process.isMain());
  if (!parsed.options) return process.finalize(parsed.exitStatus);
  const Options& options = *parsed.options;
  const int forked = process.launch() == Process::Launch::kForked ? process.count() : 1;
  if (options.procs != forked) {  // procsInArgs and parseOptions disagree: a bug
    if (process.isMain()) {
      std::printf("internal error: --procs %d, but %d processes were forked\n", options.procs, forked);
    }
    return process.finalize(1);
  }
  World world(process, options.threads);
  const int nranks = world.rankCount();
  if (spec.rooted && options.root >= nranks) {
    if (process.isMain()) std::printf("invalid root %d for %d ranks\n", options.root, nranks);
    return process.finalize(1);
  }
  const std::optional<MemoryPlan> memory = planMemory(options, process, world);
  if (!memory) return process.finalize(1);

  std::string program = argv[0];
  program = basename(program.data());
  std::optional<Report> report;
  if (process.isMain()) report.emplace(options, program, spec.name, nranks);

  const std::string devices =
      process.gatherText(describeLocalRanks(world.globalRank(0), memory->devices));
  if (report) report->printPreamble(ncclVersion, memory->line, devices);

  ncclUniqueId id{};
  if (process.isMain()) NCCL_OK(ncclGetUniqueId(&id));
  id = process.shareUniqueId(id);
  if (report) report->printTableHeader();

  int64_t failedChecks = 0;
  {
    Watchdog watchdog(options.timeoutSeconds);
    const RunContext context{options, spec, world, id, ncclVersion, nullptr, watchdog, *memory};
    RunContext printerContext = context;
    printerContext.report = report ? &*report : nullptr;

    std::vector<RankRunner> runners;
    runners.reserve(static_cast<size_t>(options.threads));
    for (int t = 0; t < options.threads; ++t) {
      runners.emplace_back(t == 0 ? printerContext : context, t);
    }
    std::vector<std::thread> threads;
    for (RankRunner& runner : runners) threads.emplace_back([&runner] { runner.run(); });
    for (std::thread& thread : threads) thread.join();
    for (const RankRunner& runner : runners) failedChecks += runner.failedChecks();
  }
  failedChecks = process.sumOverProcesses(failedChecks);

  bool ok = failedChecks == 0;
  if (report) {
    ok &= report->printFooter(failedChecks);
    ok &= report->writeFiles(ncclVersion);
  }
  return process.finalize(ok ? 0 : 1);
}

}  // namespace shoal::perf
