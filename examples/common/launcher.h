// The launcher: starts an example's ranks and gives each its communicator.
//
// A job is P processes times T rank threads per process, rank = p * T + t:
//   ./dp_train -t 4                  one process, four rank threads
//   mpirun -np 4 ./dp_train          four processes, one rank each
//   mpirun -np 2 ./dp_train -t 2     both
// MPI (optional at build time) is used only to start the processes and to
// hand every process the ncclUniqueId; all training traffic goes through
// NCCL. With one process the communicators come from ncclCommInitAll;
// otherwise each rank thread calls ncclCommInitRank.
//
// Threads: Job is used by the main thread only; the body runs once on each
// rank thread, concurrently.
#pragma once

#include <nccl.h>

#include <functional>

namespace shoal::examples {

// What one rank knows about the job.
struct RankContext {
  int rank = 0;
  int size = 1;
  ncclComm_t comm = nullptr;
  // Rank 0 prints the losses, checksums and figures.
  bool prints() const { return rank == 0; }
};

class Job {
 public:
  // Starts MPI when built with it. Call first thing in main, before parsing
  // flags (MPI may remove its own from argv).
  static Job start(int* argc, char*** argv);

  int processIndex() const { return processIndex_; }
  int processCount() const { return processCount_; }

  // Makes one communicator per local rank, runs `body` on one thread per
  // local rank, then destroys the communicators. Returns this process's exit
  // status: 0 when every local body returned 0, else 1.
  int run(int threadsPerProcess, const std::function<int(const RankContext&)>& body);

  // Ends MPI. Call once, last thing in main; returns `status` for main to
  // return.
  int finish(int status) const;

 private:
  int processIndex_ = 0;
  int processCount_ = 1;
};

}  // namespace shoal::examples
