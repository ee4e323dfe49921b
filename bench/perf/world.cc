// Processes and rank threads of a perf run; see world.h.
#include "world.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "report.h"

#ifdef SHOAL_PERF_MPI
// Only MPI's C API is used; its C++ bindings would only add warnings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace shoal::perf {
namespace {

using namespace std::chrono_literals;

// ---- Forked processes (--procs) -------------------------------------------
//
// Wire format on each socket: frames of {tag, payload length} then the
// payload. Every cross-process operation is one round: each child sends one
// frame, process 0 (the hub) reads one from every child, then sends one back
// to each. The tag names the operation, so processes out of step are caught.

enum Tag : uint32_t {
  kTagUniqueId = 1,
  kTagGatherText,
  kTagSum,
  kTagBarrier,
  kTagFinalize,
  kTagWorld = 100,  // + World's Combine
};

struct FrameHeader {
  uint32_t tag;
  uint32_t bytes;
};

// After every child has reached finalize, how long the hub waits for them
// to exit before it kills them (and fails the job).
constexpr auto kExitGrace = 60s;
// How often the hub looks for children that died.
constexpr auto kMonitorPeriod = 50ms;

struct ForkedJob {
  bool hub = false;
  int count = 1;
  std::vector<pid_t> pids;   // hub: pid of process k at [k] ([0] unused)
  std::vector<int> sockets;  // hub: socket to process k at [k]; child: [0], to the hub
  std::thread monitor;       // hub: watches the children

  std::mutex mutex;  // guards what follows; never held while calling abortJob
  std::condition_variable changed;
  std::vector<std::optional<int>> waitStatus;  // hub: of process k, once reaped
  bool finalizing = false;  // every child has reached finalize: exits are expected
  bool stopping = false;    // the monitor is to end
  bool lossReported = false;
};

// Set in forked processes only. Never destroyed: abortJob and exit must not
// race its destructor.
ForkedJob* gForked = nullptr;

bool writeAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);  // a dead peer is EPIPE, not SIGPIPE
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// False at end of file (the peer is gone) or on an error.
bool readAll(int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n == 0) return false;
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool sendFrame(int fd, uint32_t tag, const std::string& payload) {
  const FrameHeader header{tag, static_cast<uint32_t>(payload.size())};
  return writeAll(fd, &header, sizeof header) && writeAll(fd, payload.data(), payload.size());
}

bool receiveFrame(int fd, uint32_t* tag, std::string* payload) {
  FrameHeader header{};
  if (!readAll(fd, &header, sizeof header)) return false;
  payload->assign(header.bytes, '\0');
  *tag = header.tag;
  return readAll(fd, payload->data(), payload->size());
}

std::string describeWaitStatus(int status) {
  char text[128];
  if (WIFEXITED(status)) {
    std::snprintf(text, sizeof text, "exited with status %d", WEXITSTATUS(status));
  } else if (WIFSIGNALED(status)) {
    std::snprintf(text, sizeof text, "was killed by signal %d (%s)", WTERMSIG(status),
                  strsignal(WTERMSIG(status)));
  } else {
    std::snprintf(text, sizeof text, "ended (wait status 0x%x)", status);
  }
  return text;
}

// The job's exit status for a child that ended with wait status `status`:
// its own when non-zero, 128 + the signal that killed it, or 1 (it left early).
int jobStatusFor(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status) != 0 ? WEXITSTATUS(status) : 1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Hub: child k is gone (or its connection is) before the end of the job.
// Prints why (once, whoever notices first) and ends the job.
[[noreturn]] void childLost(int k, std::optional<int> status) {
  ForkedJob& job = *gForked;
  bool report = false;
  {
    std::lock_guard lock(job.mutex);
    report = !job.lossReported;
    job.lossReported = true;
  }
  if (report) {
    std::printf("%s: process %d (pid %d) %s before the end of the job; ending the job\n",
                shortHostName().c_str(), k, static_cast<int>(job.pids[static_cast<size_t>(k)]),
                status ? describeWaitStatus(*status).c_str() : "closed its connection");
  }
  Process::abortJob(status ? jobStatusFor(*status) : 1);
}

// Hub, on a read or write error with child k: the child is exiting (its end
// of the socket closes when it dies); wait a little for its status.
[[noreturn]] void childConnectionLost(int k) {
  ForkedJob& job = *gForked;
  const size_t child = static_cast<size_t>(k);
  std::optional<int> status;
  for (int attempt = 0; attempt < 100 && !status; ++attempt) {
    {
      std::lock_guard lock(job.mutex);
      if (!job.waitStatus[child]) {
        int st = 0;
        if (::waitpid(job.pids[child], &st, WNOHANG) == job.pids[child]) job.waitStatus[child] = st;
      }
      status = job.waitStatus[child];
    }
    if (!status) std::this_thread::sleep_for(kMonitorPeriod);
  }
  childLost(k, status);
}

// Child: process 0 is gone (PR_SET_PDEATHSIG normally kills us first).
[[noreturn]] void hubLost() {
  std::printf("%s: pid %d lost its connection to process 0; ending\n", shortHostName().c_str(),
              static_cast<int>(::getpid()));
  Process::abortJob(1);
}

[[noreturn]] void outOfStep(int k, uint32_t got, uint32_t expected) {
  std::printf("%s: internal error: process %d sent message %u while process 0 expected %u\n",
              shortHostName().c_str(), k, got, expected);
  Process::abortJob(1);
}

// Hub: one frame tagged `tag` from every child, in process order ([0] empty).
std::vector<std::string> receiveFromChildren(uint32_t tag) {
  ForkedJob& job = *gForked;
  std::vector<std::string> parts(static_cast<size_t>(job.count));
  for (int k = 1; k < job.count; ++k) {
    uint32_t got = 0;
    if (!receiveFrame(job.sockets[static_cast<size_t>(k)], &got, &parts[static_cast<size_t>(k)])) {
      childConnectionLost(k);
    }
    if (got != tag) outOfStep(k, got, tag);
  }
  return parts;
}

void answerChildren(uint32_t tag, const std::string& reply) {
  ForkedJob& job = *gForked;
  for (int k = 1; k < job.count; ++k) {
    if (!sendFrame(job.sockets[static_cast<size_t>(k)], tag, reply)) childConnectionLost(k);
  }
}

// Child: sends `mine`, returns the hub's answer.
std::string askHub(uint32_t tag, const std::string& mine) {
  ForkedJob& job = *gForked;
  if (!sendFrame(job.sockets[0], tag, mine)) hubLost();
  uint32_t got = 0;
  std::string reply;
  if (!receiveFrame(job.sockets[0], &got, &reply)) hubLost();
  if (got != tag) {
    std::printf("%s: internal error: process 0 answered message %u to message %u\n",
                shortHostName().c_str(), got, tag);
    Process::abortJob(1);
  }
  return reply;
}

// Hub: reaps children as they exit. One that ends before every child has
// reached finalize (killed, crashed, or exited early) ends the job.
void monitorChildren() {
  ForkedJob& job = *gForked;
  std::unique_lock lock(job.mutex);
  while (!job.stopping) {
    for (int k = 1; k < job.count; ++k) {
      const size_t child = static_cast<size_t>(k);
      if (job.waitStatus[child]) continue;
      int status = 0;
      if (::waitpid(job.pids[child], &status, WNOHANG) != job.pids[child]) continue;
      job.waitStatus[child] = status;
      job.changed.notify_all();
      if (!job.finalizing) {
        lock.unlock();
        childLost(k, status);
      }
    }
    job.changed.wait_for(lock, kMonitorPeriod, [&] { return job.stopping; });
  }
}

// Hub, on abort: kills and reaps the children still running.
void killChildren() {
  ForkedJob& job = *gForked;
  std::lock_guard lock(job.mutex);
  job.stopping = true;
  // Only children not yet reaped: a reaped child's pid may belong to
  // another process by now.
  for (int k = 1; k < job.count; ++k) {
    if (!job.waitStatus[static_cast<size_t>(k)]) ::kill(job.pids[static_cast<size_t>(k)], SIGKILL);
  }
  for (int k = 1; k < job.count; ++k) {
    if (job.waitStatus[static_cast<size_t>(k)]) continue;
    int status = 0;
    while (::waitpid(job.pids[static_cast<size_t>(k)], &status, 0) < 0 && errno == EINTR) {
    }
  }
}

// The process count of an MPI launch that started this process, from the
// launchers' environment (Open MPI, MPICH/Intel MPI/Slurm PMI, MVAPICH);
// 0 when none is seen.
int mpiLaunchSize() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"}) {
    if (const char* value = std::getenv(name)) {
      const int size = std::atoi(value);
      if (size > 0) return size;
    }
  }
  return 0;
}

[[noreturn]] void refuseForkUnderMpi(int* argc, char*** argv, int procs, int mpiProcesses) {
  bool print = true;
#ifdef SHOAL_PERF_MPI
  MPI_Init(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpiProcesses);
  print = rank == 0;
#else
  (void)argc;
  (void)argv;
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"}) {
    if (const char* value = std::getenv(name)) {
      print = std::atoi(value) == 0;
      break;
    }
  }
#endif
  if (print) {
    std::printf("invalid --procs %d: this is an MPI launch of %d processes; start ranks either "
                "with mpirun -np N or with --procs N, not both\n",
                procs, mpiProcesses);
    std::fflush(stdout);
  }
#ifdef SHOAL_PERF_MPI
  MPI_Finalize();
#endif
  std::exit(1);
}

}  // namespace

// ---- Process ----------------------------------------------------------------

Process Process::init(int* argc, char*** argv, int forkedProcesses) {
  Process process;
  if (forkedProcesses > 1) {
    if (const int launched = mpiLaunchSize(); launched > 1) {
      refuseForkUnderMpi(argc, argv, forkedProcesses, launched);
    }
    auto* job = new ForkedJob;
    job->count = forkedProcesses;
    const size_t count = static_cast<size_t>(forkedProcesses);
    // Every socket exists before the first fork; each child then keeps only
    // its own end, so that the hub sees end of file when a child dies.
    std::vector<std::array<int, 2>> pairs(count, {-1, -1});
    for (size_t k = 1; k < count; ++k) {
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pairs[k].data()) != 0) {
        std::printf("--procs: socketpair failed: %s\n", std::strerror(errno));
        std::exit(1);
      }
    }
    job->pids.assign(count, 0);
    job->waitStatus.assign(count, std::nullopt);
    job->sockets.assign(count, -1);
    gForked = job;
    std::fflush(nullptr);  // nothing buffered may be written twice
    const pid_t hubPid = ::getpid();
    for (size_t k = 1; k < count; ++k) {
      const pid_t pid = ::fork();
      if (pid < 0) {
        std::printf("--procs: fork failed: %s\n", std::strerror(errno));
        job->count = static_cast<int>(k);  // the children made so far
        killChildren();
        std::exit(1);
      }
      if (pid == 0) {
        // Child k. The death signal comes when the thread that forked
        // exits: the hub's main thread, which lives until the job ends.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != hubPid) std::_Exit(1);  // the hub died before prctl
        for (size_t m = 1; m < count; ++m) {
          ::close(pairs[m][0]);
          if (m != k) ::close(pairs[m][1]);
        }
        job->hub = false;
        job->sockets.assign(1, pairs[k][1]);
        job->pids.clear();
        job->waitStatus.clear();
        process.index_ = static_cast<int>(k);
        process.count_ = forkedProcesses;
        process.launch_ = Launch::kForked;
        return process;
      }
      job->pids[k] = pid;
    }
    for (size_t k = 1; k < count; ++k) {
      ::close(pairs[k][1]);
      job->sockets[k] = pairs[k][0];
    }
    job->hub = true;
    job->monitor = std::thread(monitorChildren);
    process.count_ = forkedProcesses;
    process.launch_ = Launch::kForked;
    return process;
  }
#ifdef SHOAL_PERF_MPI
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    std::fprintf(stderr, "MPI does not provide MPI_THREAD_SERIALIZED; rank threads need it\n");
    abortJob(1);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &process.index_);
  MPI_Comm_size(MPI_COMM_WORLD, &process.count_);
  process.launch_ = Launch::kMpi;
#else
  (void)argc;
  (void)argv;
#endif
  return process;
}

std::string Process::hubRound(uint32_t tag, const std::string& mine, const Combine& combine) const {
  if (!gForked->hub) return askHub(tag, mine);
  std::vector<std::string> parts = receiveFromChildren(tag);
  parts[0] = mine;
  std::string reply = combine(parts);
  answerChildren(tag, reply);
  return reply;
}

ncclUniqueId Process::shareUniqueId(const ncclUniqueId& mine) const {
  ncclUniqueId id = mine;
  if (count_ <= 1) return id;
  if (launch_ == Launch::kForked) {
    const std::string reply =
        hubRound(kTagUniqueId, std::string(reinterpret_cast<const char*>(&mine), sizeof mine),
                 [](const std::vector<std::string>& parts) { return parts[0]; });
    std::memcpy(&id, reply.data(), std::min(reply.size(), sizeof id));
  }
#ifdef SHOAL_PERF_MPI
  if (launch_ == Launch::kMpi) MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
  return id;
}

std::string Process::gatherText(const std::string& mine) const {
  if (count_ <= 1) return mine;
  if (launch_ == Launch::kForked) {
    std::string all;
    (void)hubRound(kTagGatherText, mine, [&all](const std::vector<std::string>& parts) {
      for (const std::string& part : parts) all += part;
      return std::string();
    });
    return all;  // empty in the children
  }
#ifdef SHOAL_PERF_MPI
  if (launch_ == Launch::kMpi) {
    int length = static_cast<int>(mine.size());
    std::vector<int> lengths(isMain() ? count_ : 0);
    MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    std::vector<int> offsets(lengths.size());
    int total = 0;
    for (size_t p = 0; p < lengths.size(); ++p) {
      offsets[p] = total;
      total += lengths[p];
    }
    std::string all(static_cast<size_t>(total), '\0');
    MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                MPI_CHAR, 0, MPI_COMM_WORLD);
    return isMain() ? all : std::string();
  }
#endif
  return mine;
}

int64_t Process::sumOverProcesses(int64_t value) const {
  if (count_ <= 1) return value;
  if (launch_ == Launch::kForked) {
    const std::string reply = hubRound(
        kTagSum, std::string(reinterpret_cast<const char*>(&value), sizeof value),
        [](const std::vector<std::string>& parts) {
          int64_t total = 0;
          for (const std::string& part : parts) {
            int64_t v = 0;
            std::memcpy(&v, part.data(), std::min(part.size(), sizeof v));
            total += v;
          }
          return std::string(reinterpret_cast<const char*>(&total), sizeof total);
        });
    int64_t total = 0;
    std::memcpy(&total, reply.data(), std::min(reply.size(), sizeof total));
    return total;
  }
#ifdef SHOAL_PERF_MPI
  if (launch_ == Launch::kMpi) {
    long long total = value;
    MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    return total;
  }
#endif
  return value;
}

void Process::barrier() const {
  if (count_ <= 1) return;
  if (launch_ == Launch::kForked) {
    (void)hubRound(kTagBarrier, std::string(),
                   [](const std::vector<std::string>&) { return std::string(); });
  }
#ifdef SHOAL_PERF_MPI
  if (launch_ == Launch::kMpi) MPI_Barrier(MPI_COMM_WORLD);
#endif
}

int Process::finalize(int status) const {
#ifdef SHOAL_PERF_MPI
  if (launch_ == Launch::kMpi) MPI_Finalize();
#endif
  if (launch_ != Launch::kForked) return status;
  ForkedJob& job = *gForked;
  const std::string mine(reinterpret_cast<const char*>(&status), sizeof status);
  // A child waits for the hub's answer before it exits, so that the hub can
  // tell an exit at the end from one in the middle of the job.
  if (!job.hub) {
    (void)askHub(kTagFinalize, mine);
    return status;
  }
  (void)receiveFromChildren(kTagFinalize);
  {
    std::lock_guard lock(job.mutex);
    job.finalizing = true;
  }
  answerChildren(kTagFinalize, std::string());

  std::unique_lock lock(job.mutex);
  const auto allReaped = [&] {
    return std::all_of(job.waitStatus.begin() + 1, job.waitStatus.end(),
                       [](const std::optional<int>& s) { return s.has_value(); });
  };
  bool failed = status != 0;
  int childStatus = 0;
  if (!job.changed.wait_for(lock, kExitGrace, allReaped)) {
    for (int k = 1; k < job.count; ++k) {
      const size_t child = static_cast<size_t>(k);
      if (job.waitStatus[child]) continue;
      std::printf("%s: process %d (pid %d) did not exit within %lld s of the end; killing it\n",
                  shortHostName().c_str(), k, static_cast<int>(job.pids[child]),
                  static_cast<long long>(std::chrono::seconds(kExitGrace).count()));
      ::kill(job.pids[child], SIGKILL);
      int st = 0;
      while (::waitpid(job.pids[child], &st, 0) < 0 && errno == EINTR) {
      }
      job.waitStatus[child] = st;
    }
  }
  for (int k = 1; k < job.count; ++k) {
    const int st = *job.waitStatus[static_cast<size_t>(k)];
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    failed = true;
    if (childStatus == 0) childStatus = jobStatusFor(st);
  }
  job.stopping = true;
  job.changed.notify_all();
  lock.unlock();
  job.monitor.join();
  for (int k = 1; k < job.count; ++k) ::close(job.sockets[static_cast<size_t>(k)]);
  if (!failed) return 0;
  return status != 0 ? status : childStatus;
}

void Process::abortJob(int status) {
  // Several rank threads may fail at once: the first one ends the job, the
  // others wait for the end.
  static std::atomic<bool> ending{false};
  if (ending.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef SHOAL_PERF_MPI
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, status);
#endif
  // The hub takes its children along; a child simply exits, and the hub,
  // which watches it, ends the others.
  if (gForked != nullptr && gForked->hub) killChildren();
  // Other rank threads may be blocked inside NCCL: leave without running
  // destructors or atexit handlers.
  std::_Exit(status);
}

// ---- World ------------------------------------------------------------------

World::World(const Process& process, int threadsPerProcess)
    : process_(process), threads_(threadsPerProcess) {}

void World::barrier(int thread) { collective(thread, Value{}, Combine::kNone, false); }

double World::combineTime(int thread, double seconds, TimeAggregation how) {
  Combine combine = Combine::kAverage;
  switch (how) {
    case TimeAggregation::kRank0: combine = Combine::kRank0; break;
    case TimeAggregation::kAverage: combine = Combine::kAverage; break;
    case TimeAggregation::kMin: combine = Combine::kMin; break;
    case TimeAggregation::kMax: combine = Combine::kMax; break;
  }
  return collective(thread, Value{.real = seconds}, combine, true).real;
}

int64_t World::sum(int thread, int64_t value) {
  return collective(thread, Value{.integer = value}, Combine::kSum, false).integer;
}

World::Value World::collective(int thread, Value value, Combine how, bool isReal) {
  std::unique_lock lock(mutex_);
  const uint64_t myRound = round_;

  // Fold this thread's value into the process-local accumulator.
  if (arrived_ == 0) accumulator_ = value;
  switch (how) {
    case Combine::kRank0:
      if (thread == 0) accumulator_ = value;
      break;
    case Combine::kSum:
    case Combine::kAverage:
      if (arrived_ > 0) fold(accumulator_, value, how);
      break;
    case Combine::kMin:
    case Combine::kMax:
      fold(accumulator_, value, how);
      break;
    case Combine::kNone:
      break;
  }

  if (++arrived_ < threads_) {
    // A later round cannot start before this thread arrives again, so
    // result_ still holds this round's value when the wait returns.
    roundDone_.wait(lock, [&] { return round_ != myRound; });
    return result_;
  }

  // Last thread of this process: combine across processes.
  Value combined = acrossProcesses(accumulator_, how, isReal);
  if (how == Combine::kAverage) combined.real /= rankCount();
  result_ = combined;
  arrived_ = 0;
  ++round_;
  roundDone_.notify_all();
  return result_;
}

// acc = acc (+, min, max) v, as `how` says; kRank0 and kNone keep acc.
void World::fold(Value& acc, const Value& v, Combine how) {
  switch (how) {
    case Combine::kSum:
    case Combine::kAverage:
      acc.real += v.real;
      acc.integer += v.integer;
      break;
    case Combine::kMin:
      acc.real = std::min(acc.real, v.real);
      acc.integer = std::min(acc.integer, v.integer);
      break;
    case Combine::kMax:
      acc.real = std::max(acc.real, v.real);
      acc.integer = std::max(acc.integer, v.integer);
      break;
    case Combine::kRank0:
    case Combine::kNone:
      break;
  }
}

World::Value World::acrossProcesses(Value value, Combine how, bool isReal) const {
  if (process_.count() <= 1) return value;
  Value combined = value;
  if (process_.launch() == Process::Launch::kForked) {
    const auto decode = [](const std::string& bytes) {
      Value v;
      std::memcpy(&v, bytes.data(), std::min(bytes.size(), sizeof v));
      return v;
    };
    const std::string reply = process_.hubRound(
        kTagWorld + static_cast<uint32_t>(how),
        std::string(reinterpret_cast<const char*>(&value), sizeof value),
        [&](const std::vector<std::string>& parts) {
          Value total = decode(parts[0]);  // kRank0: process 0's; kNone: unused
          for (size_t p = 1; p < parts.size(); ++p) {
            const Value v = decode(parts[p]);
            switch (how) {
              case Combine::kSum:
              case Combine::kAverage:
              case Combine::kMin:
              case Combine::kMax:
                fold(total, v, how);
                break;
              case Combine::kRank0:
              case Combine::kNone:
                break;
            }
          }
          return std::string(reinterpret_cast<const char*>(&total), sizeof total);
        });
    combined = decode(reply);
  }
#ifdef SHOAL_PERF_MPI
  if (process_.launch() == Process::Launch::kMpi) {
    void* data = isReal ? static_cast<void*>(&combined.real) : static_cast<void*>(&combined.integer);
    MPI_Datatype type = isReal ? MPI_DOUBLE : MPI_INT64_T;
    switch (how) {
      case Combine::kNone: MPI_Barrier(MPI_COMM_WORLD); break;
      case Combine::kRank0: MPI_Bcast(data, 1, type, 0, MPI_COMM_WORLD); break;
      case Combine::kSum:
      case Combine::kAverage: MPI_Allreduce(MPI_IN_PLACE, data, 1, type, MPI_SUM, MPI_COMM_WORLD); break;
      case Combine::kMin: MPI_Allreduce(MPI_IN_PLACE, data, 1, type, MPI_MIN, MPI_COMM_WORLD); break;
      case Combine::kMax: MPI_Allreduce(MPI_IN_PLACE, data, 1, type, MPI_MAX, MPI_COMM_WORLD); break;
    }
  }
#else
  (void)isReal;
#endif
  return combined;
}

}  // namespace shoal::perf
