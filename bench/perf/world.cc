// Processes and rank threads of a perf run; see world.h.
#include "world.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#ifdef SHOAL_PERF_MPI
// Only MPI's C API is used; its C++ bindings would only add warnings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace shoal::perf {

// ---- Process ----------------------------------------------------------------

Process Process::init(int* argc, char*** argv) {
  Process process;
#ifdef SHOAL_PERF_MPI
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    std::fprintf(stderr, "MPI does not provide MPI_THREAD_SERIALIZED; rank threads need it\n");
    abortJob(1);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &process.index_);
  MPI_Comm_size(MPI_COMM_WORLD, &process.count_);
#else
  (void)argc;
  (void)argv;
#endif
  return process;
}

ncclUniqueId Process::shareUniqueId(const ncclUniqueId& mine) const {
  ncclUniqueId id = mine;
#ifdef SHOAL_PERF_MPI
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
  return id;
}

std::string Process::gatherText(const std::string& mine) const {
#ifdef SHOAL_PERF_MPI
  if (count_ > 1) {
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
#ifdef SHOAL_PERF_MPI
  long long total = value;
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return total;
#else
  return value;
#endif
}

void Process::barrier() const {
#ifdef SHOAL_PERF_MPI
  MPI_Barrier(MPI_COMM_WORLD);
#endif
}

void Process::finalize() const {
#ifdef SHOAL_PERF_MPI
  MPI_Finalize();
#endif
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
  MPI_Initialized(&initialized);
  if (initialized) MPI_Abort(MPI_COMM_WORLD, status);
#endif
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
      if (arrived_ > 0) {
        accumulator_.real += value.real;
        accumulator_.integer += value.integer;
      }
      break;
    case Combine::kMin:
      accumulator_.real = std::min(accumulator_.real, value.real);
      accumulator_.integer = std::min(accumulator_.integer, value.integer);
      break;
    case Combine::kMax:
      accumulator_.real = std::max(accumulator_.real, value.real);
      accumulator_.integer = std::max(accumulator_.integer, value.integer);
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
  Value combined = accumulator_;
#ifdef SHOAL_PERF_MPI
  if (process_.count() > 1) {
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
  if (how == Combine::kAverage) combined.real /= rankCount();
  result_ = combined;
  arrived_ = 0;
  ++round_;
  roundDone_.notify_all();
  return result_;
}

}  // namespace shoal::perf
