// The benchmark's launch layout: processes times rank threads.
//
// Role: only here do processes talk to each other, and only for bootstrap and
// bookkeeping, as in nccl-tests: broadcast of the unique id, barriers, and
// reductions of times and error counts. All communication under test goes
// through NCCL. The processes are one of:
//   - a single process (no MPI, or one MPI process);
//   - MPI processes under mpirun (built with MPI, SHOAL_PERF_MPI);
//   - forked processes (--procs N, no MPI needed): process 0 forks the others
//     before anything calls NCCL or CUDA and is their hub: each child has one
//     socket to it, every cross-process operation is "each child sends its
//     part to the hub, the hub combines and answers each child". The hub also
//     watches the children: one that dies, or exits before the end, ends the
//     whole job (abortJob); children die with the hub (PR_SET_PDEATHSIG).
//
// Threads: Process is used by the main thread only, except abortJob (any
// thread). World is shared by the rank threads of one process; each of its
// collective calls must be made by every rank thread of every process, in the
// same order. Inside, the last thread of a process to arrive makes the
// cross-process call (so MPI needs MPI_THREAD_SERIALIZED) while the others
// wait on a condition variable.
#pragma once

#include <nccl.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace shoal::perf {

// One process of the job: its index and the process count (0 and 1 alone).
class Process {
 public:
  enum class Launch { kSingle, kMpi, kForked };

  // Call once, first thing, before anything calls NCCL or CUDA. With
  // `forkedProcesses` > 1 (--procs) forks that many processes in all (this
  // one is process 0) and does not start MPI; then a launch by mpirun of more
  // than one process is an error: it prints why and exits with status 1.
  // Otherwise starts MPI when built with it (SHOAL_PERF_MPI).
  static Process init(int* argc, char*** argv, int forkedProcesses);

  int index() const { return index_; }
  int count() const { return count_; }
  bool isMain() const { return index_ == 0; }
  Launch launch() const { return launch_; }

  // Process 0 makes the id; every process returns it.
  ncclUniqueId shareUniqueId(const ncclUniqueId& mine) const;
  // Process 0 returns every process's text, in process order; others "".
  std::string gatherText(const std::string& mine) const;
  int64_t sumOverProcesses(int64_t value) const;
  void barrier() const;
  // Call once, last thing, with this process's exit status; returns the
  // status the process should exit with. Under MPI ends MPI (mpirun reports
  // every process's status). With --procs, process 0 waits for the others to
  // exit and returns non-zero if any of them failed (or it did itself).
  [[nodiscard]] int finalize(int status) const;

  // Ends the whole job at once (all processes) with exit status `status`.
  [[noreturn]] static void abortJob(int status);

  // Forked processes only: every process sends `mine` to process 0, which
  // passes all of them (in process order) to `combine` and sends what it
  // returns to every process; every process returns that. Used by World.
  using Combine = std::function<std::string(const std::vector<std::string>& parts)>;
  std::string hubRound(uint32_t tag, const std::string& mine, const Combine& combine) const;

 private:
  int index_ = 0;
  int count_ = 1;
  Launch launch_ = Launch::kSingle;
};

// How per-rank times combine into the reported time (-a).
enum class TimeAggregation { kRank0 = 0, kAverage = 1, kMin = 2, kMax = 3 };

// Barriers and reductions across every rank thread of every process.
class World {
 public:
  World(const Process& process, int threadsPerProcess);

  int rankCount() const { return process_.count() * threads_; }
  int globalRank(int thread) const { return process_.index() * threads_ + thread; }

  void barrier(int thread);
  double combineTime(int thread, double seconds, TimeAggregation how);
  int64_t sum(int thread, int64_t value);

 private:
  enum class Combine { kRank0, kSum, kMin, kMax, kAverage, kNone };
  struct Value {
    double real = 0;
    int64_t integer = 0;
  };
  static void fold(Value& acc, const Value& v, Combine how);
  Value collective(int thread, Value value, Combine how, bool isReal);
  Value acrossProcesses(Value value, Combine how, bool isReal) const;

  const Process& process_;
  const int threads_;
  std::mutex mutex_;
  std::condition_variable roundDone_;
  int arrived_ = 0;
  uint64_t round_ = 0;
  Value accumulator_;
  Value result_;
};

}  // namespace shoal::perf
