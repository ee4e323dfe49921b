// Soak driver (see soak.h and README.md).
#include "soak/soak.h"

#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <nccl.h>
#include <shoal/shoal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "api/api_guard.h"  // ncclComm's shared state: CommCall's mark (abort mode)
#include "support/mp_harness.h"

namespace shoal::soak {
namespace {

double nowMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

void sleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

int countDir(const char* path, const std::string& prefix = "") {
  DIR* dir = ::opendir(path);
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(dir)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    if (!prefix.empty() && std::strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0) continue;
    ++n;
  }
  ::closedir(dir);
  return n;
}

std::string describe(ncclResult_t rc) {
  return std::string(ncclGetErrorString(rc)) + " (" + std::to_string(static_cast<int>(rc)) +
         "): " + ncclGetLastError(nullptr);
}

#define SOAK_NCCL(call)                                                                           \
  do {                                                                                            \
    ncclResult_t rc_ = (call);                                                                    \
    if (rc_ != ncclSuccess)                                                                       \
      return std::string("line ") + std::to_string(__LINE__) + ": " #call " -> " + describe(rc_); \
  } while (0)

#define SOAK_CHECK(cond, what)                                                                        \
  do {                                                                                                \
    if (!(cond)) return std::string("line ") + std::to_string(__LINE__) + ": " #cond " -- " + (what); \
  } while (0)

#define SOAK_TRY(expr)          \
  do {                          \
    std::string e_ = (expr);    \
    if (!e_.empty()) return e_; \
  } while (0)

// Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress.
ncclResult_t waitReady(ncclComm_t comm, int timeoutMs = 60000) {
  double deadline = nowMs() + timeoutMs;
  int polls = 0;
  while (true) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return rc;
    if (state != ncclInProgress) return state;
    if (nowMs() > deadline) return ncclInProgress;
    // Spin briefly, then yield, then sleep: ranks on 2 cores must not starve
    // the threads that do the work.
    if (++polls > 64) {
      if (polls > 4096)
        sleepMs(1);
      else
        std::this_thread::yield();
    }
  }
}

// A call that may answer ncclInProgress (nonblocking comm), then the wait.
std::string finish(ncclResult_t rc, ncclComm_t comm, bool nonblocking, const char* what) {
  if (rc == ncclInProgress && nonblocking) rc = ncclSuccess;
  if (rc != ncclSuccess) return std::string(what) + " -> " + describe(rc);
  if (!nonblocking) return "";
  ncclResult_t state = waitReady(comm);
  if (state != ncclSuccess) return std::string(what) + ": ncclCommGetAsyncError -> " + describe(state);
  return "";
}

// The test's own buffers come straight from mmap and go back with munmap, so
// that what malloc keeps after they are freed (its trim and mmap thresholds)
// does not show up in the RSS figures as if the library held it.
template <typename T>
class Mapped {
 public:
  explicit Mapped(size_t n, T fill = T()) : n_(n) {
    if (n_ == 0) return;
    void* p = ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    p_ = static_cast<T*>(p);
    std::fill(p_, p_ + n_, fill);
  }
  Mapped(Mapped&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  Mapped& operator=(Mapped&&) = delete;
  ~Mapped() {
    if (p_) ::munmap(p_, bytes());
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }

 private:
  size_t bytes() const { return n_ * sizeof(T); }
  T* p_ = nullptr;
  size_t n_ = 0;
};

// ---------------------------------------------------------------------------
// Self-check: SOAK_INJECT=fd|thread|shm|rss|heap|data makes the test itself
// leak that resource (or corrupt one result) during the measured run, so that
// ctest can show the checks catch it (tests.cmake, soak.selfcheck.*).
// ---------------------------------------------------------------------------

enum class Inject { kNone, kFd, kThread, kShm, kRss, kHeap, kData };

Inject injected() {
  static const Inject which = [] {
    const char* v = std::getenv("SOAK_INJECT");
    std::string s = v ? v : "";
    if (s == "fd") return Inject::kFd;
    if (s == "thread") return Inject::kThread;
    if (s == "shm") return Inject::kShm;
    if (s == "rss") return Inject::kRss;
    if (s == "heap") return Inject::kHeap;
    if (s == "data") return Inject::kData;
    return Inject::kNone;
  }();
  return which;
}

std::atomic<bool> gMeasuring{false};  // inside a measured run (data injection)
std::mutex gInjectMutex;
std::vector<std::string> gInjectedShm;

void unlinkInjectedShm() {
  std::lock_guard<std::mutex> lock(gInjectMutex);
  for (const auto& name : gInjectedShm) ::shm_unlink(name.c_str());
  gInjectedShm.clear();
}

// Called after measured repetition k of `ops`: leaks about 20 of the resource
// per run (heap: 32 bytes every repetition).
void injectLeak(long k, long ops) {
  const Inject what = injected();
  if (what == Inject::kNone || what == Inject::kData) return;
  if (what == Inject::kHeap) {
    static std::vector<void*>* kept = new std::vector<void*>();  // reachable, not freed
    std::lock_guard<std::mutex> lock(gInjectMutex);
    kept->push_back(std::malloc(16));
    return;
  }
  if (k % std::max(1L, ops / 20) != 0) return;
  switch (what) {
    case Inject::kFd: (void)::open("/dev/null", O_RDONLY | O_CLOEXEC); break;
    case Inject::kThread:
      std::thread([] {
        while (true) sleepMs(60000);
      }).detach();
      break;
    case Inject::kShm: {
      static std::atomic<int> seq{0};
      std::string name = "/shoal-" + std::to_string(::getpid()) + "-soak-inject-" + std::to_string(seq++);
      int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
      if (fd >= 0) ::close(fd);
      std::lock_guard<std::mutex> lock(gInjectMutex);
      if (gInjectedShm.empty()) std::atexit(unlinkInjectedShm);
      gInjectedShm.push_back(name);
      break;
    }
    case Inject::kRss: {
      const size_t bytes = 1 << 20;
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p != MAP_FAILED) std::memset(p, 1, bytes);
      break;
    }
    default: break;
  }
}

// ---------------------------------------------------------------------------
// Data: small integers, every sum over <= 3 ranks exact in float.
// ---------------------------------------------------------------------------

float value(long iter, int rank, size_t j) {
  return static_cast<float>((static_cast<long>(j % 1000003) * 7 + rank * 5 + iter * 3) % 13);
}
constexpr float kSentinel = -1000.f;

// Operation kinds of the collective modes.
enum Kind {
  kAllReduceSum,
  kAllReduceMaxInPlace,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kReduce,
  kAlltoAll,
  kGather,
  kScatter,
  kKinds
};
const char* kindName(int k) {
  static const char* names[] = {"AllReduce(sum)", "AllReduce(max, in place, int32)",
                                "Broadcast",      "AllGather",
                                "ReduceScatter",  "Reduce",
                                "AlltoAll",       "Gather",
                                "Scatter"};
  return names[k];
}
// Per-rank counts; one of every kind at every size within 72 operations.
constexpr size_t kSizes[] = {1, 5, 64, 255, 1024, 4093, 16384, 65536};
constexpr int kNumSizes = 8;
constexpr size_t kMaxCount = 65536;

struct OpShape {
  int kind;
  size_t count;
  int root;
};
OpShape shapeOf(long i, int n) {
  OpShape s;
  s.kind = static_cast<int>(i % kKinds);
  s.count = kSizes[(i / kKinds) % kNumSizes];
  s.root = static_cast<int>((i / (kKinds * kNumSizes)) % n);
  return s;
}
// Every combination of kind and size is checked: 5 is coprime with 72.
bool checkedOp(long i) { return i % 5 == 0; }

struct Buffers {
  Mapped<float> send, recv;
  Mapped<int32_t> ints;
  explicit Buffers(int n) : send(kMaxCount * n), recv(kMaxCount * n), ints(kMaxCount) {}
};

void prepare(const OpShape& s, Buffers& b, long iter, int r, int n) {
  const size_t c = s.count;
  switch (s.kind) {
    case kAllReduceMaxInPlace:
      for (size_t j = 0; j < c; ++j) b.ints[j] = static_cast<int32_t>(value(iter, r, j)) - 6;
      return;
    case kReduceScatter:
    case kAlltoAll:
    case kScatter:
      for (size_t j = 0; j < c * n; ++j) b.send[j] = value(iter, r, j);
      break;
    default:
      for (size_t j = 0; j < c; ++j) b.send[j] = value(iter, r, j);
  }
  std::fill(b.recv.begin(), b.recv.begin() + static_cast<ptrdiff_t>(c * n), kSentinel);
}

ncclResult_t issue(const OpShape& s, Buffers& b, ncclComm_t comm, cudaStream_t stream) {
  const size_t c = s.count;
  float* send = b.send.data();
  float* recv = b.recv.data();
  switch (s.kind) {
    case kAllReduceSum: return ncclAllReduce(send, recv, c, ncclFloat, ncclSum, comm, stream);
    case kAllReduceMaxInPlace:
      return ncclAllReduce(b.ints.data(), b.ints.data(), c, ncclInt32, ncclMax, comm, stream);
    case kBroadcast: return ncclBroadcast(send, recv, c, ncclFloat, s.root, comm, stream);
    case kAllGather: return ncclAllGather(send, recv, c, ncclFloat, comm, stream);
    case kReduceScatter: return ncclReduceScatter(send, recv, c, ncclFloat, ncclSum, comm, stream);
    case kReduce: return ncclReduce(send, recv, c, ncclFloat, ncclSum, s.root, comm, stream);
    case kAlltoAll: return ncclAlltoAll(send, recv, c, ncclFloat, comm, stream);
    case kGather: return ncclGather(send, recv, c, ncclFloat, s.root, comm, stream);
    default: return ncclScatter(send, recv, c, ncclFloat, s.root, comm, stream);
  }
}

std::string mismatch(const OpShape& s, long iter, size_t j, double got, double want) {
  char line[256];
  std::snprintf(line, sizeof(line), "%s of %zu elements (operation %ld, root %d): element %zu is %g, expected %g",
                kindName(s.kind), s.count, iter, s.root, j, got, want);
  return line;
}

std::string verify(const OpShape& s, const Buffers& b, long iter, int r, int n) {
  const size_t c = s.count;
  auto sumAt = [&](size_t j) {
    float t = 0;
    for (int q = 0; q < n; ++q) t += value(iter, q, j);
    return t;
  };
  switch (s.kind) {
    case kAllReduceSum:
      for (size_t j = 0; j < c; ++j)
        if (b.recv[j] != sumAt(j)) return mismatch(s, iter, j, b.recv[j], sumAt(j));
      return "";
    case kAllReduceMaxInPlace:
      for (size_t j = 0; j < c; ++j) {
        int32_t want = -100;
        for (int q = 0; q < n; ++q) want = std::max(want, static_cast<int32_t>(value(iter, q, j)) - 6);
        if (b.ints[j] != want) return mismatch(s, iter, j, b.ints[j], want);
      }
      return "";
    case kBroadcast:
      for (size_t j = 0; j < c; ++j)
        if (b.recv[j] != value(iter, s.root, j)) return mismatch(s, iter, j, b.recv[j], value(iter, s.root, j));
      return "";
    case kAllGather:
    case kGather:
      if (s.kind == kGather && r != s.root) return "";
      for (int q = 0; q < n; ++q)
        for (size_t j = 0; j < c; ++j)
          if (b.recv[q * c + j] != value(iter, q, j))
            return mismatch(s, iter, q * c + j, b.recv[q * c + j], value(iter, q, j));
      return "";
    case kReduceScatter:
      for (size_t j = 0; j < c; ++j)
        if (b.recv[j] != sumAt(r * c + j)) return mismatch(s, iter, j, b.recv[j], sumAt(r * c + j));
      return "";
    case kReduce:
      if (r != s.root) return "";
      for (size_t j = 0; j < c; ++j)
        if (b.recv[j] != sumAt(j)) return mismatch(s, iter, j, b.recv[j], sumAt(j));
      return "";
    case kAlltoAll:
      for (int q = 0; q < n; ++q)
        for (size_t j = 0; j < c; ++j)
          if (b.recv[q * c + j] != value(iter, q, r * c + j))
            return mismatch(s, iter, q * c + j, b.recv[q * c + j], value(iter, q, r * c + j));
      return "";
    default:  // Scatter
      for (size_t j = 0; j < c; ++j)
        if (b.recv[j] != value(iter, s.root, r * c + j))
          return mismatch(s, iter, j, b.recv[j], value(iter, s.root, r * c + j));
      return "";
  }
}

// Communicator handles this process made (the heap allowance: the library
// keeps released handles, kHandleBytes each, up to api::kHandleQuarantine).
std::atomic<long> gCommsMade{0};
long commsMade() { return gCommsMade.load(); }
constexpr long kHandleBytes = 48;

// A communicator of every rank from a fresh id (rank 0's, handed out by the link).
std::string makeComm(RankLink& link, bool blocking, ncclComm_t* out) {
  *out = nullptr;
  ncclUniqueId id;
  std::string err;
  if (!link.shareId(&id, &err)) return "shareId: " + err;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blocking ? 1 : 0;
  ncclResult_t rc = ncclCommInitRankConfig(out, link.nranks(), id, link.rank(), &cfg);
  gCommsMade.fetch_add(1);
  if (rc != ncclSuccess && !(rc == ncclInProgress && !blocking))
    return "ncclCommInitRankConfig -> " + describe(rc);
  if (!blocking) {
    ncclResult_t state = waitReady(*out);
    if (state == ncclInProgress) {
      // Given up on: an init still running cannot be destroyed, only aborted.
      (void)ncclCommAbort(*out);
      *out = nullptr;
    }
    if (state != ncclSuccess) return "nonblocking init: ncclCommGetAsyncError -> " + describe(state);
  }
  int count = -1, rank = -1;
  SOAK_NCCL(ncclCommCount(*out, &count));
  SOAK_NCCL(ncclCommUserRank(*out, &rank));
  SOAK_CHECK(count == link.nranks() && rank == link.rank(), "ncclCommCount/UserRank disagree with the init");
  return "";
}

// An AllReduce sum of `count` floats on comm (comm's own ranks), checked.
std::string checkedAllReduce(ncclComm_t comm, int rank, int n, long iter, size_t count, bool nonblocking) {
  Mapped<float> send(count), recv(count, kSentinel);
  for (size_t j = 0; j < count; ++j) send[j] = value(iter, rank, j);
  SOAK_TRY(finish(ncclAllReduce(send.data(), recv.data(), count, ncclFloat, ncclSum, comm, nullptr), comm,
                  nonblocking, "ncclAllReduce"));
  for (size_t j = 0; j < count; ++j) {
    float want = 0;
    for (int q = 0; q < n; ++q) want += value(iter, q, j);
    if (recv[j] != want) {
      char line[160];
      std::snprintf(line, sizeof(line), "AllReduce on a %d-rank communicator: element %zu is %g, expected %g", n,
                    j, static_cast<double>(recv[j]), static_cast<double>(want));
      return line;
    }
  }
  return "";
}

// ---------------------------------------------------------------------------
// Patterns: what one repetition of a mode does on one rank.
// ---------------------------------------------------------------------------

class Pattern {
 public:
  explicit Pattern(RankLink& link) : link_(link), r_(link.rank()), n_(link.nranks()) {}
  virtual ~Pattern() = default;
  virtual std::string setup() { return ""; }
  // Repetition i; checks its data on the mode's sample (counted in checks_).
  virtual std::string step(long i) = 0;
  virtual std::string teardown() { return ""; }
  long checks() const { return checks_; }

 protected:
  RankLink& link_;
  const int r_, n_;
  long checks_ = 0;
};

// Blocking or nonblocking collectives, one at a time.
class CollectivePattern : public Pattern {
 public:
  CollectivePattern(RankLink& link, bool nonblocking) : Pattern(link), nonblocking_(nonblocking), b_(n_) {}
  std::string setup() override { return makeComm(link_, !nonblocking_, &comm_); }
  std::string step(long i) override {
    OpShape s = shapeOf(i, n_);
    bool check = checkedOp(i);
    if (check) prepare(s, b_, i, r_, n_);
    SOAK_TRY(finish(issue(s, b_, comm_, nullptr), comm_, nonblocking_, kindName(s.kind)));
    if (!check) return "";
    if (injected() == Inject::kData && gMeasuring.load() && s.kind == kAllReduceSum) b_.recv[0] += 1;
    ++checks_;
    return verify(s, b_, i, r_, n_);
  }
  std::string teardown() override {
    if (comm_ == nullptr) return "";
    ncclComm_t c = std::exchange(comm_, nullptr);
    SOAK_NCCL(ncclCommDestroy(c));
    return "";
  }
  ~CollectivePattern() override {
    if (comm_) (void)ncclCommAbort(comm_);
  }

 private:
  bool nonblocking_;
  Buffers b_;
  ncclComm_t comm_ = nullptr;
};

// Host streams: batches of kBatch operations on one stream, then a
// synchronize; the stream is destroyed and made again every 1000 operations.
class HostStreamPattern : public Pattern {
 public:
  static constexpr int kBatch = 4;
  explicit HostStreamPattern(RankLink& link) : Pattern(link) {
    for (int k = 0; k < kBatch; ++k) slots_.emplace_back(n_);
  }
  std::string setup() override {
    SOAK_TRY(makeComm(link_, true, &comm_));
    SOAK_NCCL(shoalHostStreamCreate(&stream_));
    return "";
  }
  // Operation i is enqueued; every kBatch-th one synchronizes the batch.
  std::string step(long i) override {
    if (enqueued_ >= 1000 && pending_.empty()) {
      SOAK_NCCL(shoalHostStreamDestroy(std::exchange(stream_, nullptr)));
      SOAK_NCCL(shoalHostStreamCreate(&stream_));
      enqueued_ = 0;
    }
    ++enqueued_;
    int slot = static_cast<int>(pending_.size());
    OpShape s = shapeOf(i, n_);
    if (checkedOp(i)) prepare(s, slots_[slot], i, r_, n_);
    SOAK_NCCL(issue(s, slots_[slot], comm_, reinterpret_cast<cudaStream_t>(stream_)));
    pending_.push_back(i);
    if (static_cast<int>(pending_.size()) < kBatch) return "";
    return drain();
  }
  std::string teardown() override {
    SOAK_TRY(drain());
    if (stream_) SOAK_NCCL(shoalHostStreamDestroy(std::exchange(stream_, nullptr)));
    if (comm_) SOAK_NCCL(ncclCommDestroy(std::exchange(comm_, nullptr)));
    return "";
  }
  ~HostStreamPattern() override {
    if (stream_) (void)shoalHostStreamSynchronize(stream_);
    if (comm_) (void)ncclCommAbort(comm_);
    if (stream_) (void)shoalHostStreamDestroy(stream_);
  }

 private:
  std::string drain() {
    if (pending_.empty()) return "";
    SOAK_NCCL(shoalHostStreamSynchronize(stream_));
    ncclResult_t async = ncclInProgress;
    SOAK_NCCL(ncclCommGetAsyncError(comm_, &async));
    SOAK_CHECK(async == ncclSuccess, "async error after synchronize: " + describe(async));
    std::vector<long> done;
    done.swap(pending_);
    for (size_t k = 0; k < done.size(); ++k) {
      if (!checkedOp(done[k])) continue;
      ++checks_;
      SOAK_TRY(verify(shapeOf(done[k], n_), slots_[k], done[k], r_, n_));
    }
    return "";
  }
  std::vector<Buffers> slots_;
  std::vector<long> pending_;
  long enqueued_ = 0;  // on the current stream
  ncclComm_t comm_ = nullptr;
  shoalHostStream_t stream_ = nullptr;
};

// Grouped: AllReduce, Broadcast, AllGather and a ring exchange (both
// directions at 3+ ranks) in one ncclGroupStart/End.
class GroupedPattern : public Pattern {
 public:
  static constexpr size_t kMax = 16384;
  explicit GroupedPattern(RankLink& link)
      : Pattern(link),
        arSend(kMax),
        arRecv(kMax),
        bcSend(kMax),
        bcRecv(kMax),
        agSend(kMax),
        agRecv(kMax * n_),
        p2pSend(kMax),
        fromPrev(kMax),
        fromNext(kMax) {}
  std::string setup() override { return makeComm(link_, true, &comm_); }
  std::string step(long i) override {
    const size_t c = kSizes[i % 7];  // up to 16384
    const int root = static_cast<int>(i % n_);
    const int next = (r_ + 1) % n_, prev = (r_ + n_ - 1) % n_;
    const bool check = checkedOp(i);
    if (check) {
      for (size_t j = 0; j < c; ++j) {
        arSend[j] = value(i, r_, j);
        bcSend[j] = value(i + 1, r_, j);
        agSend[j] = value(i + 2, r_, j);
        p2pSend[j] = value(i + 3, r_, j);
      }
      for (auto* v : {&arRecv, &bcRecv, &agRecv, &fromPrev, &fromNext}) std::fill(v->begin(), v->end(), kSentinel);
    }
    SOAK_NCCL(ncclGroupStart());
    ncclResult_t rcs[7] = {};
    int k = 0;
    rcs[k++] = ncclAllReduce(arSend.data(), arRecv.data(), c, ncclFloat, ncclSum, comm_, nullptr);
    rcs[k++] = ncclBroadcast(bcSend.data(), bcRecv.data(), c, ncclFloat, root, comm_, nullptr);
    rcs[k++] = ncclAllGather(agSend.data(), agRecv.data(), c, ncclFloat, comm_, nullptr);
    rcs[k++] = ncclSend(p2pSend.data(), c, ncclFloat, next, comm_, nullptr);
    rcs[k++] = ncclRecv(fromPrev.data(), c, ncclFloat, prev, comm_, nullptr);
    if (n_ > 2) {
      rcs[k++] = ncclSend(p2pSend.data(), c, ncclFloat, prev, comm_, nullptr);
      rcs[k++] = ncclRecv(fromNext.data(), c, ncclFloat, next, comm_, nullptr);
    }
    ncclResult_t end = ncclGroupEnd();
    for (int q = 0; q < k; ++q)
      SOAK_CHECK(rcs[q] == ncclSuccess, "call " + std::to_string(q) + " in the group: " + describe(rcs[q]));
    SOAK_CHECK(end == ncclSuccess, "ncclGroupEnd: " + describe(end));
    if (!check) return "";
    ++checks_;
    for (size_t j = 0; j < c; ++j) {
      float sum = 0;
      for (int q = 0; q < n_; ++q) sum += value(i, q, j);
      SOAK_CHECK(arRecv[j] == sum, "grouped AllReduce element " + std::to_string(j) + " of " + std::to_string(c));
      SOAK_CHECK(bcRecv[j] == value(i + 1, root, j), "grouped Broadcast element " + std::to_string(j));
      for (int q = 0; q < n_; ++q)
        SOAK_CHECK(agRecv[q * c + j] == value(i + 2, q, j),
                   "grouped AllGather element " + std::to_string(q * c + j));
      SOAK_CHECK(fromPrev[j] == value(i + 3, prev, j),
                 "grouped Recv from the previous rank, element " + std::to_string(j));
      if (n_ > 2)
        SOAK_CHECK(fromNext[j] == value(i + 3, next, j),
                   "grouped Recv from the next rank, element " + std::to_string(j));
    }
    return "";
  }
  std::string teardown() override {
    if (comm_) SOAK_NCCL(ncclCommDestroy(std::exchange(comm_, nullptr)));
    return "";
  }
  ~GroupedPattern() override {
    if (comm_) (void)ncclCommAbort(comm_);
  }

 private:
  Mapped<float> arSend, arRecv, bcSend, bcRecv, agSend, agRecv, p2pSend, fromPrev, fromNext;
  ncclComm_t comm_ = nullptr;
};

// Split churn: three colourings in turn, blocking and nonblocking children;
// each child is checked (every other one) and destroyed.
class SplitPattern : public Pattern {
 public:
  using Pattern::Pattern;
  std::string setup() override { return makeComm(link_, true, &parent_); }
  std::string step(long i) override {
    const int pattern = static_cast<int>(i % 3);
    const bool nonblocking = (i / 3) % 2 == 1;
    int color = 0, key = 0, wantRank = 0, wantSize = 0;
    switch (pattern) {
      case 0:  // everyone, in reverse order
        color = 0, key = n_ - 1 - r_, wantRank = n_ - 1 - r_, wantSize = n_;
        break;
      case 1:  // by parity
        color = r_ % 2, key = r_, wantRank = r_ / 2, wantSize = (n_ - r_ % 2 + 1) / 2;
        break;
      default:  // the last rank takes part without a communicator
        color = r_ == n_ - 1 ? NCCL_SPLIT_NOCOLOR : 0, key = r_, wantRank = r_, wantSize = n_ - 1;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = nonblocking ? 0 : 1;
    ncclComm_t child = nullptr;
    ncclResult_t rc = ncclCommSplit(parent_, color, key, &child, &cfg);
    if (color != NCCL_SPLIT_NOCOLOR) gCommsMade.fetch_add(1);
    if (color == NCCL_SPLIT_NOCOLOR) {
      SOAK_CHECK(rc == ncclSuccess, "ncclCommSplit with NCCL_SPLIT_NOCOLOR -> " + describe(rc));
      SOAK_CHECK(child == nullptr, "NCCL_SPLIT_NOCOLOR gave a communicator");
      return "";
    }
    SOAK_TRY(finish(rc, child, nonblocking, "ncclCommSplit"));
    SOAK_CHECK(child != nullptr, "ncclCommSplit gave no communicator");
    int count = -1, rank = -1;
    std::string err;
    if (ncclCommCount(child, &count) != ncclSuccess || ncclCommUserRank(child, &rank) != ncclSuccess ||
        count != wantSize || rank != wantRank)
      err = "split " + std::to_string(i) + ": child is rank " + std::to_string(rank) + " of " +
            std::to_string(count) + ", expected " + std::to_string(wantRank) + " of " + std::to_string(wantSize);
    if (err.empty() && i % 2 == 0) {
      ++checks_;
      err = checkedAllReduce(child, wantRank, wantSize, i, 1000, nonblocking);
    }
    ncclResult_t d = ncclCommDestroy(child);
    if (err.empty() && d != ncclSuccess) err = "ncclCommDestroy of a child -> " + describe(d);
    return err;
  }
  std::string teardown() override {
    if (parent_) SOAK_NCCL(ncclCommDestroy(std::exchange(parent_, nullptr)));
    return "";
  }
  ~SplitPattern() override {
    if (parent_) (void)ncclCommAbort(parent_);
  }

 private:
  ncclComm_t parent_ = nullptr;
};

// Init/destroy churn: a communicator of every rank from a fresh id, blocking
// and nonblocking in turn; every other one checked.
class InitDestroyPattern : public Pattern {
 public:
  using Pattern::Pattern;
  std::string step(long i) override {
    const bool nonblocking = i % 2 == 1;
    ncclComm_t comm = nullptr;
    std::string err = makeComm(link_, !nonblocking, &comm);
    if (err.empty() && (i / 2) % 2 == 0) {
      ++checks_;
      err = checkedAllReduce(comm, r_, n_, i, 4093, nonblocking);
    }
    if (comm) {
      ncclResult_t d = ncclCommDestroy(comm);
      if (err.empty() && d != ncclSuccess) err = "ncclCommDestroy -> " + describe(d);
    }
    return err;
  }
};

// Abort churn, on a fresh communicator each time (its data checked first).
// Even repetitions: a nonblocking communicator; every rank but one (the
// "absent" rank, rotating) starts an AllReduce that cannot finish without it
// and sees it in flight (ncclInProgress from the call and from
// ncclCommGetAsyncError); they abort it, then the absent rank aborts its idle
// communicator. Odd repetitions: a blocking communicator; one rank (the
// caller, rotating) blocks in an AllReduce that the others never call, and a
// watchdog thread aborts it from outside once the call is inside the
// library; then the others abort theirs.
//
// The ranks that called abort first and the others after a barrier (and
// callers abort only once all of them saw their call in flight): a rank
// blocked in a call whose peer aborts first fails with a remote error and
// then waits up to 1.5 s for that peer's failure report (README.md, "What
// the soak found"), which would make this mode take minutes.
class AbortPattern : public Pattern {
 public:
  using Pattern::Pattern;
  std::string step(long i) override {
    const bool watchdog = i % 2 == 1;
    const int turn = static_cast<int>((i / 2) % n_);
    ncclComm_t comm = nullptr;
    if (std::string e = makeComm(link_, watchdog, &comm); !e.empty()) {
      if (comm) (void)ncclCommAbort(comm);
      return e;
    }
    std::string err = checkedAllReduce(comm, r_, n_, i, 64, !watchdog);
    if (!err.empty()) {
      (void)ncclCommAbort(comm);
      return err;
    }
    ++checks_;
    const size_t count = 16384;
    Mapped<float> send(count, 1.f), recv(count);
    const bool calls = watchdog ? r_ == turn : r_ != turn;
    if (!calls) {
      // Nonblocking: once every caller has seen its AllReduce in flight, and
      // again once they have aborted.
      if (!watchdog && !link_.barrier()) err = "barrier before the others' abort";
      if (!link_.barrier() && err.empty()) err = "barrier after the others' abort";
      ncclResult_t a = ncclCommAbort(comm);
      if (err.empty() && a != ncclSuccess) err = "ncclCommAbort (rank that did not call) -> " + describe(a);
      return err;
    }
    if (!watchdog) {
      ncclResult_t rc = ncclAllReduce(send.data(), recv.data(), count, ncclFloat, ncclSum, comm, nullptr);
      ncclResult_t state = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(comm, &state);
      if (rc != ncclInProgress)
        err = "a nonblocking AllReduce without one rank returned " + describe(rc) + ", not ncclInProgress";
      else if (q != ncclSuccess || state != ncclInProgress)
        err = "a nonblocking AllReduce without one rank is not in progress: " + describe(state);
      if (!link_.barrier() && err.empty()) err = "barrier before the abort";
      ncclResult_t a = ncclCommAbort(comm);
      if (err.empty() && a != ncclSuccess) err = "ncclCommAbort of an operation in flight -> " + describe(a);
      if (!link_.barrier() && err.empty()) err = "barrier after the abort";
      return err;
    }
    // Blocking: the watchdog aborts once the call is inside the library
    // (CommCall's mark; earlier would free the handle before the call reads it).
    std::string dogError;
    ncclResult_t abortRc = ncclSuccess;
    std::thread dog([&] {
      double deadline = nowMs() + 30000;
      while (comm->shared->callsInside.load() == 0 && nowMs() < deadline) sleepMs(1);
      if (comm->shared->callsInside.load() == 0) dogError = "the blocking AllReduce never entered the library";
      sleepMs(2);
      abortRc = ncclCommAbort(comm);
    });
    ncclResult_t rc = ncclAllReduce(send.data(), recv.data(), count, ncclFloat, ncclSum, comm, nullptr);
    dog.join();
    if (!link_.barrier()) return "barrier after the abort";
    SOAK_CHECK(dogError.empty(), dogError);
    SOAK_CHECK(rc != ncclSuccess, "a blocking AllReduce without the other ranks succeeded");
    SOAK_CHECK(abortRc == ncclSuccess, "ncclCommAbort from the watchdog -> " + describe(abortRc));
    return "";
  }
};

std::unique_ptr<Pattern> makePattern(Mode m, RankLink& link) {
  switch (m) {
    case Mode::kBlocking: return std::make_unique<CollectivePattern>(link, false);
    case Mode::kNonblocking: return std::make_unique<CollectivePattern>(link, true);
    case Mode::kHostStream: return std::make_unique<HostStreamPattern>(link);
    case Mode::kGrouped: return std::make_unique<GroupedPattern>(link);
    case Mode::kSplit: return std::make_unique<SplitPattern>(link);
    case Mode::kInitDestroy: return std::make_unique<InitDestroyPattern>(link);
    case Mode::kAbort: return std::make_unique<AbortPattern>(link);
  }
  return nullptr;
}

// ---------------------------------------------------------------------------
// Threads as ranks
// ---------------------------------------------------------------------------

// A reusable barrier that a failing rank can break, with a timeout.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  bool wait(int timeoutMs) {
    std::unique_lock<std::mutex> lock(m_);
    if (broken_) return false;
    const uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return true;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    while (gen_ == gen && !broken_) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && gen_ == gen) {
        broken_ = true;
        cv_.notify_all();
      }
    }
    return gen_ != gen;
  }
  void breakAll() {
    std::lock_guard<std::mutex> lock(m_);
    broken_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  uint64_t gen_ = 0;
  bool broken_ = false;
};

struct ThreadShared {
  explicit ThreadShared(int n) : barrier(n), n(n) {}
  Barrier barrier;
  int n;
  // Three slots, used in turn: slot k+1 is reset by rank 0 during call k,
  // when every rank has read it (call k-2) and none writes it yet.
  ncclUniqueId ids[3];
  std::string idErrors[3];
  std::atomic<int> votes[3] = {0, 0, 0};
  std::mutex printMutex;
};

constexpr int kBarrierTimeoutMs = 180000;

class ThreadLink : public RankLink {
 public:
  ThreadLink(ThreadShared& s, int rank) : s_(s), rank_(rank) {}
  int rank() const override { return rank_; }
  int nranks() const override { return s_.n; }
  bool barrier() override { return s_.barrier.wait(kBarrierTimeoutMs); }
  bool shareId(ncclUniqueId* id, std::string* error) override {
    const int slot = static_cast<int>(idCalls_++ % 3);
    if (rank_ == 0) {
      ncclResult_t rc = ncclGetUniqueId(&s_.ids[slot]);
      s_.idErrors[slot] = rc == ncclSuccess ? "" : "ncclGetUniqueId -> " + describe(rc);
    }
    if (!barrier()) {
      *error = "barrier";
      return false;
    }
    *id = s_.ids[slot];
    *error = s_.idErrors[slot];
    return error->empty();
  }
  bool any(bool mine) override {
    const int slot = static_cast<int>(anyCalls_++ % 3);
    if (rank_ == 0) s_.votes[(slot + 1) % 3].store(0);
    if (mine) s_.votes[slot].fetch_add(1);
    if (!barrier()) return true;
    return s_.votes[slot].load() > 0;
  }
  bool measures() const override { return rank_ == 0; }
  void print(const std::string& line) override {
    std::lock_guard<std::mutex> lock(s_.printMutex);
    std::printf("[soak threads r%d] %s\n", rank_, line.c_str());
    std::fflush(stdout);
  }
  void fail() override { s_.barrier.breakAll(); }
  std::string setting() const override { return "threads"; }

 private:
  ThreadShared& s_;
  const int rank_;
  uint64_t idCalls_ = 0, anyCalls_ = 0;
};

// ---------------------------------------------------------------------------
// Forked processes as ranks
// ---------------------------------------------------------------------------

class ForkLink : public RankLink {
 public:
  ForkLink(testing::MpChild& child, ncclComm_t base, std::string transport)
      : child_(child), base_(base), transport_(std::move(transport)) {}
  int rank() const override { return child_.rank(); }
  int nranks() const override { return child_.nranks(); }
  bool barrier() override { return child_.barrier(kBarrierTimeoutMs); }
  // Rank 0's id over the base communicator, as a job hands ids out over its
  // own transport; byte 128 says whether rank 0 had one.
  bool shareId(ncclUniqueId* id, std::string* error) override {
    uint8_t msg[sizeof(ncclUniqueId) + 1] = {};
    if (rank() == 0) {
      ncclResult_t rc = ncclGetUniqueId(id);
      if (rc == ncclSuccess) {
        std::memcpy(msg, id->internal, sizeof(ncclUniqueId));
        msg[sizeof(ncclUniqueId)] = 1;
      } else {
        *error = "ncclGetUniqueId -> " + describe(rc);
      }
    }
    ncclResult_t rc = ncclBroadcast(msg, msg, sizeof(msg), ncclUint8, 0, base_, nullptr);
    if (rc != ncclSuccess) {
      *error = "ncclBroadcast of the id on the base communicator -> " + describe(rc);
      return false;
    }
    if (msg[sizeof(ncclUniqueId)] != 1) {
      if (error->empty()) *error = "rank 0 could not make an id";
      return false;
    }
    std::memcpy(id->internal, msg, sizeof(ncclUniqueId));
    return true;
  }
  bool any(bool mine) override {
    int32_t v = mine ? 1 : 0;
    if (ncclAllReduce(&v, &v, 1, ncclInt32, ncclMax, base_, nullptr) != ncclSuccess) return true;
    return v != 0;
  }
  bool measures() const override { return true; }
  void print(const std::string& line) override {
    char prefix[64];
    std::snprintf(prefix, sizeof(prefix), "[soak %s r%d pid %d] ", transport_.c_str(), rank(),
                  static_cast<int>(::getpid()));
    std::string text = prefix + line + "\n";
    // One write per line: lines of concurrent ranks do not mix.
    (void)!::write(STDOUT_FILENO, text.data(), text.size());
  }
  std::string setting() const override { return transport_; }

 private:
  testing::MpChild& child_;
  ncclComm_t base_;
  std::string transport_;
};

void setDeadlines() {
  // Every wait in the library has a deadline; these make a broken behaviour
  // fail in seconds rather than hang (before any Shoal call).
  ::setenv("SHOAL_PROGRESS_TIMEOUT_MS", "30000", 0);
  ::setenv("SHOAL_INIT_TIMEOUT_MS", "30000", 0);
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
}

std::string row(const char* name, long a, long b, long c, long d, const char* unit = "") {
  char line[160];
  std::snprintf(line, sizeof(line), "  %-8s %12ld %12ld %12ld %12ld %s", name, a, b, c, d, unit);
  return line;
}

}  // namespace

// ---------------------------------------------------------------------------
// Resources
// ---------------------------------------------------------------------------

Resources sampleResources() {
  Resources r;
  r.threads = countDir("/proc/self/task");
  r.fds = countDir("/proc/self/fd");
  r.shmOwn = countDir("/dev/shm", "shoal-" + std::to_string(::getpid()) + "-");
  r.shmAll = countDir("/dev/shm");
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    long size = 0, resident = 0;
    if (std::fscanf(f, "%ld %ld", &size, &resident) == 2) r.rssKiB = resident * (::sysconf(_SC_PAGESIZE) / 1024);
    std::fclose(f);
  }
  struct mallinfo2 mi = ::mallinfo2();
  r.heapKiB = static_cast<long>((mi.uordblks + mi.hblkhd) / 1024);
  return r;
}

std::string formatResources(const Resources& r) {
  char line[200];
  std::snprintf(line, sizeof(line), "threads %d fds %d shm %d (all %d) rss %ld KiB heap %ld KiB", r.threads, r.fds,
                r.shmOwn, r.shmAll, r.rssKiB, r.heapKiB);
  return line;
}

std::string compareResources(const Resources& base, const Resources& after, const Slack& slack, bool checkHeap) {
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : "; ") + s; };
  if (after.threads > base.threads)
    add("threads " + std::to_string(base.threads) + " -> " + std::to_string(after.threads));
  if (after.fds > base.fds) add("fds " + std::to_string(base.fds) + " -> " + std::to_string(after.fds));
  if (after.shmOwn > base.shmOwn)
    add("/dev/shm entries " + std::to_string(base.shmOwn) + " -> " + std::to_string(after.shmOwn));
  if (after.rssKiB - base.rssKiB > slack.rssKiB)
    add("RSS " + std::to_string(base.rssKiB) + " -> " + std::to_string(after.rssKiB) + " KiB (slack " +
        std::to_string(slack.rssKiB) + ")");
  if (checkHeap && after.heapKiB - base.heapKiB > slack.heapKiB)
    add("heap " + std::to_string(base.heapKiB) + " -> " + std::to_string(after.heapKiB) + " KiB (slack " +
        std::to_string(slack.heapKiB) + ")");
  return out;
}

Resources settleTo(const Resources& base, int settleMs) {
  double deadline = nowMs() + settleMs;
  Resources r = sampleResources();
  while ((r.threads > base.threads || r.fds > base.fds || r.shmOwn > base.shmOwn) && nowMs() < deadline) {
    sleepMs(20);
    r = sampleResources();
  }
  return r;
}

// ---------------------------------------------------------------------------
// Modes
// ---------------------------------------------------------------------------

const char* modeName(Mode m) {
  switch (m) {
    case Mode::kBlocking: return "blocking";
    case Mode::kNonblocking: return "nonblocking";
    case Mode::kHostStream: return "hoststream";
    case Mode::kGrouped: return "grouped";
    case Mode::kSplit: return "split";
    case Mode::kInitDestroy: return "initdestroy";
    case Mode::kAbort: return "abort";
  }
  return "?";
}

bool parseMode(const std::string& name, Mode* out) {
  for (Mode m : kAllModes)
    if (name == modeName(m)) {
      *out = m;
      return true;
    }
  return false;
}

const char* modeUnit(Mode m) {
  switch (m) {
    case Mode::kGrouped: return "groups";
    case Mode::kSplit: return "splits";
    case Mode::kInitDestroy: return "communicators";
    case Mode::kAbort: return "aborts";
    default: return "collectives";
  }
}

ModeCounts testCounts(Mode m) {
  switch (m) {
    case Mode::kSplit: return {200, 500};
    case Mode::kInitDestroy: return {100, 200};
    case Mode::kAbort: return {100, 500};
    default: return {400, 20000};
  }
}

ModeResult runMode(Mode m, RankLink& link, const ModeCounts& counts, const Slack& slack, bool verbose) {
  ModeResult res;
  const std::string name = modeName(m);
  auto failed = [&](std::string e) {
    res.error = name + ": " + e;
    link.print("FAILED " + res.error);
    link.fail();
    return res;
  };
  auto sync = [&]() { return link.barrier(); };
  const bool measures = link.measures();
  const double t0 = nowMs();
  long i = 0;  // repetition index, continued across phases (the data changes)

  // Cycle 0: one whole life of the mode, so that what the library makes once
  // per process (engine, progress thread, root server, transports) exists.
  {
    auto p = makePattern(m, link);
    if (auto e = p->setup(); !e.empty()) return failed("setup (warm-up cycle): " + e);
    for (long k = 0; k < std::max(1L, counts.warmup / 2); ++k, ++i)
      if (auto e = p->step(i); !e.empty())
        return failed("warm-up cycle, repetition " + std::to_string(i) + ": " + e);
    if (auto e = p->teardown(); !e.empty()) return failed("teardown (warm-up cycle): " + e);
  }
  if (!sync()) return failed("barrier");
  if (measures) res.idleBefore = settleTo(sampleResources());
  if (!sync()) return failed("barrier");

  auto p = makePattern(m, link);
  if (auto e = p->setup(); !e.empty()) return failed("setup: " + e);
  for (long k = 0; k < counts.warmup; ++k, ++i)
    if (auto e = p->step(i); !e.empty()) return failed("warm-up, repetition " + std::to_string(i) + ": " + e);
  if (!sync()) return failed("barrier");
  if (measures) res.baseline = sampleResources();
  long commsAt[4] = {commsMade(), 0, 0, 0};
  long heapAt[4] = {res.baseline.heapKiB, 0, 0, 0};
  if (!sync()) return failed("barrier");
  const long checksBefore = p->checks();
  const double tRun = nowMs();
  // The measured run in three thirds, the heap sampled between them (every
  // rank idle): a leak grows it in every third, a one-time allocation in one.
  for (int third = 0; third < 3; ++third) {
    const long n = third < 2 ? counts.ops / 3 : counts.ops - 2 * (counts.ops / 3);
    gMeasuring = true;
    for (long k = 0; k < n; ++k, ++i) {
      if (auto e = p->step(i); !e.empty()) {
        gMeasuring = false;
        return failed("repetition " + std::to_string(i) + ": " + e);
      }
      injectLeak(res.ops, counts.ops);
      ++res.ops;
    }
    gMeasuring = false;
    if (third == 2) break;
    if (!sync()) return failed("barrier");
    if (measures) {
      heapAt[third + 1] = sampleResources().heapKiB;
      commsAt[third + 1] = commsMade();
    }
    if (!sync()) return failed("barrier");
  }
  const double runSeconds = (nowMs() - tRun) / 1e3;
  res.dataChecks = p->checks() - checksBefore;
  if (!sync()) return failed("barrier");
  if (measures) {
    res.after = settleTo(res.baseline);
    heapAt[3] = res.after.heapKiB;
    commsAt[3] = commsMade();
  }
  if (!sync()) return failed("barrier");
  if (auto e = p->teardown(); !e.empty()) return failed("teardown: " + e);
  p.reset();
  if (!sync()) return failed("barrier");
  if (measures) res.idleAfter = settleTo(res.idleBefore);
  if (!sync()) return failed("barrier");
  res.seconds = (nowMs() - t0) / 1e3;

  if (!measures) return res;
  std::string during = compareResources(res.baseline, res.after, slack);
  std::string idle = compareResources(res.idleBefore, res.idleAfter, slack);
  if (!during.empty()) res.leak = "while running: " + during;
  if (!idle.empty()) res.leak += (res.leak.empty() ? "" : "; ") + std::string("after teardown: ") + idle;
  // Heap: a leak if every third grew by more than its allowance.
  long growth[3], allowance[3];
  bool everyThird = true;
  for (int t = 0; t < 3; ++t) {
    growth[t] = heapAt[t + 1] - heapAt[t];
    allowance[t] = slack.heapPerThirdKiB + (commsAt[t + 1] - commsAt[t]) * kHandleBytes / 1024;
    if (growth[t] <= allowance[t]) everyThird = false;
  }
  char heapLine[320];
  std::snprintf(heapLine, sizeof(heapLine),
                "heap growth per third of the run %+ld %+ld %+ld KiB (allowance %ld %ld %ld KiB: %ld KiB + %ld B "
                "per communicator made; %ld made), %.0f B per %s",
                growth[0], growth[1], growth[2], allowance[0], allowance[1], allowance[2], slack.heapPerThirdKiB,
                kHandleBytes, commsAt[3] - commsAt[0],
                res.ops > 0 ? (heapAt[3] - heapAt[0]) * 1024.0 / static_cast<double>(res.ops) : 0.0,
                std::string(modeUnit(m)).substr(0, std::string(modeUnit(m)).size() - 1).c_str());
  if (everyThird) res.heapLeak = heapLine;

  if (!verbose && res.leak.empty() && res.heapLeak.empty()) return res;
  char head[240];
  std::snprintf(head, sizeof(head), "%s: %ld %s at %d ranks (%ld data-checked) in %.1f s (%.0f/s; mode %.1f s)",
                name.c_str(), res.ops, modeUnit(m), link.nranks(), res.dataChecks, runSeconds,
                runSeconds > 0 ? res.ops / runSeconds : 0.0, res.seconds);
  link.print(head);
  link.print(name + ":            idle-before     baseline        after   idle-after");
  const Resources &a = res.idleBefore, &b = res.baseline, &c = res.after, &d = res.idleAfter;
  link.print(name + ":" + row("threads", a.threads, b.threads, c.threads, d.threads));
  link.print(name + ":" + row("fds", a.fds, b.fds, c.fds, d.fds));
  link.print(name + ":" + row("shm", a.shmOwn, b.shmOwn, c.shmOwn, d.shmOwn, "(own: shoal-<pid>-*)"));
  link.print(name + ":" +
             row("shm-all", a.shmAll, b.shmAll, c.shmAll, d.shmAll, "(whole /dev/shm, not compared)"));
  link.print(name + ":" + row("rss", a.rssKiB, b.rssKiB, c.rssKiB, d.rssKiB, "KiB"));
  link.print(name + ":" + row("heap", a.heapKiB, b.heapKiB, c.heapKiB, d.heapKiB, "KiB"));
  char verdict[200];
  std::snprintf(verdict, sizeof(verdict),
                "rss %+ld KiB run / %+ld KiB idle (slack %ld KiB), heap %+ld KiB run / %+ld KiB idle",
                c.rssKiB - b.rssKiB, d.rssKiB - a.rssKiB, slack.rssKiB, c.heapKiB - b.heapKiB,
                d.heapKiB - a.heapKiB);
  link.print(name + ": " + (res.leak.empty() ? "PASS " : "LEAK ") + verdict);
  if (!res.leak.empty()) link.print(name + ": LEAK " + res.leak);
  link.print(name + ": " + (everyThird ? "HEAP GROWS " : "heap flat: ") + heapLine);
  return res;
}

int runModesOnce(RankLink& link, const std::vector<Mode>& modes, const Slack& slack) {
  int code = 0;
  for (Mode m : modes) {
    ModeResult res = runMode(m, link, testCounts(m), slack, true);
    if (!res.error.empty()) return 1;
    if (!res.leak.empty()) code |= 2;
    if (!res.heapLeak.empty()) code |= 4;
  }
  return code;
}

std::vector<int> runThreadRanks(int n, const std::function<int(RankLink&)>& body) {
  setDeadlines();
  ThreadShared shared(n);
  std::vector<int> codes(n, 1);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ThreadLink link(shared, r);
      try {
        codes[r] = body(link);
      } catch (const std::exception& e) {
        link.print(std::string("exception: ") + e.what());
        codes[r] = 3;
      }
      if (codes[r] == 1 || codes[r] == 3) link.fail();
    });
  for (auto& t : threads) t.join();
  return codes;
}

bool runForkedRanks(int n, const std::string& transport, int hardLimitMs,
                    const std::function<int(RankLink&)>& body, std::string* report) {
  testing::MpConfig cfg;
  cfg.nranks = n;
  cfg.hardLimitMs = hardLimitMs;
  cfg.env = {{"SHOAL_TRANSPORT", transport},
             {"NCCL_SOCKET_IFNAME", "lo"},
             {"SHOAL_PROGRESS_TIMEOUT_MS", "30000"},
             {"SHOAL_INIT_TIMEOUT_MS", "30000"}};
  std::fflush(stdout);
  testing::MpResult res = testing::runForked(cfg, [&](testing::MpChild& child) -> int {
    ncclUniqueId id;
    if (!child.uniqueId(&id)) return 1;
    ncclComm_t base = nullptr;
    ncclResult_t rc = ncclCommInitRank(&base, n, id, child.rank());
    if (rc != ncclSuccess) {
      child.log("base communicator: ncclCommInitRank -> " + describe(rc));
      return 1;
    }
    ForkLink link(child, base, transport);
    // The base communicator's connections exist before anything is measured.
    ncclUniqueId warm;
    std::string err;
    if (!link.shareId(&warm, &err)) {
      child.log("warming the base communicator: " + err);
      return 1;
    }
    (void)link.any(false);
    int code = body(link);
    if (code != 0) child.log("body returned " + std::to_string(code));
    // Destroying the base communicator is a collective flush; a rank that
    // failed must not wait for it.
    if (code == 1 || code == 3) {
      (void)ncclCommAbort(base);
    } else {
      (void)child.barrier(60000);
      rc = ncclCommDestroy(base);
      if (rc != ncclSuccess) {
        child.log("ncclCommDestroy of the base communicator -> " + describe(rc));
        if (code == 0) code = 1;
      }
    }
    return code;
  });
  if (report) *report = res.report();
  return res.allPassed();
}

}  // namespace shoal::soak
