// Processes (MPI, optional) times rank threads, and the communicators they
// share; see launcher.h.
#include "launcher.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "check.h"

#ifdef SHOAL_EXAMPLES_MPI
// Only MPI's C API is used; its C++ bindings would only add warnings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace shoal::examples {

void failNccl(const char* file, int line, const char* call, ncclResult_t result) {
  std::fprintf(stderr, "%s:%d %s failed: %s: %s\n", file, line, call, ncclGetErrorString(result),
               ncclGetLastError(nullptr));
  endJob(1);
}

void endJob(int status) {
  // Several rank threads may fail at once: the first one ends the job while
  // the others wait here for the end.
  static std::atomic<bool> ending{false};
  if (ending.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef SHOAL_EXAMPLES_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Abort(MPI_COMM_WORLD, status);
#endif
  // Other rank threads may be blocked inside NCCL waiting for this one:
  // leave without running destructors.
  std::_Exit(status);
}

Job Job::start(int* argc, char*** argv) {
  Job job;
#ifdef SHOAL_EXAMPLES_MPI
  // Only the main thread calls MPI, before and after the rank threads run.
  MPI_Init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &job.processIndex_);
  MPI_Comm_size(MPI_COMM_WORLD, &job.processCount_);
#else
  (void)argc;
  (void)argv;
#endif
  return job;
}

int Job::run(int threadsPerProcess, const std::function<int(const RankContext&)>& body) {
  const int size = processCount_ * threadsPerProcess;
  std::vector<ncclComm_t> comms(threadsPerProcess, nullptr);

  // One process: the whole job is here, so ncclCommInitAll makes every
  // communicator at once (over Shoal's in-process loopback transport).
  // Several processes: process 0 makes the unique id, MPI hands it out, and
  // every rank thread joins with ncclCommInitRank (they must do so
  // concurrently, hence inside the threads below).
  ncclUniqueId id{};
  if (processCount_ == 1) {
    CHECK_NCCL(ncclCommInitAll(comms.data(), threadsPerProcess, nullptr));
  } else {
    if (processIndex_ == 0) CHECK_NCCL(ncclGetUniqueId(&id));
#ifdef SHOAL_EXAMPLES_MPI
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
  }

  std::vector<int> statuses(threadsPerProcess, 0);
  std::vector<std::thread> threads;
  for (int local = 0; local < threadsPerProcess; ++local) {
    threads.emplace_back([&, local] {
      RankContext context{.rank = processIndex_ * threadsPerProcess + local, .size = size};
      if (processCount_ == 1) {
        context.comm = comms[local];
      } else {
        CHECK_NCCL(ncclCommInitRank(&context.comm, size, id, context.rank));
        comms[local] = context.comm;
      }
      statuses[local] = body(context);
    });
  }
  for (auto& thread : threads) thread.join();
  for (ncclComm_t comm : comms) CHECK_NCCL(ncclCommDestroy(comm));

  int status = 0;
  for (int s : statuses) status |= (s != 0);
  return status;
}

int Job::finish(int status) const {
#ifdef SHOAL_EXAMPLES_MPI
  // mpirun reports the first non-zero exit status of any process.
  MPI_Finalize();
#endif
  return status;
}

}  // namespace shoal::examples
