// The benchmark's launch layout: processes (MPI, optional) times rank threads.
//
// Role: MPI is used only here, and only for bootstrap and bookkeeping, as in
// nccl-tests: broadcast of the unique id, barriers, and reductions of times
// and error counts. All communication under test goes through NCCL.
//
// Threads: Process is used by the main thread only. World is shared by the
// rank threads of one process; each of its collective calls must be made by
// every rank thread of every process, in the same order. Inside, the last
// thread of a process to arrive makes the MPI call (so MPI needs
// MPI_THREAD_SERIALIZED) while the others wait on a condition variable.
#pragma once

#include <nccl.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace shoal::perf {

// One process of the job: MPI rank and size (0 and 1 without MPI).
class Process {
 public:
  // Starts MPI when built with it (SHOAL_PERF_MPI). Call once, first thing.
  static Process init(int* argc, char*** argv);

  int index() const { return index_; }
  int count() const { return count_; }
  bool isMain() const { return index_ == 0; }

  // Process 0 makes the id; every process returns it.
  ncclUniqueId shareUniqueId(const ncclUniqueId& mine) const;
  // Process 0 returns every process's text, in process order; others "".
  std::string gatherText(const std::string& mine) const;
  int64_t sumOverProcesses(int64_t value) const;
  void barrier() const;
  // Ends MPI. Call once, last thing.
  void finalize() const;

  // Ends the whole job at once (all processes) with exit status `status`.
  [[noreturn]] static void abortJob(int status);

 private:
  int index_ = 0;
  int count_ = 1;
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
  Value collective(int thread, Value value, Combine how, bool isReal);

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
