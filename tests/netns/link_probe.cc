// netns_link_probe: the program of the link-down test (tests/netns). One rank
// per MPI process; MPI only broadcasts the unique id, all traffic is NCCL's.
//
//   netns_link_probe [seconds (default 60)] [bytes per allreduce (default 1 MiB)]
//   netns_link_probe --idle [seconds (default 60)] [bytes per allreduce (default 1 MiB)]
//   netns_link_probe --shrink [seconds (default 60)] [bytes per allreduce (default 1 MiB)]
//
// Runs float-sum allreduces back to back for `seconds`, checking every result.
// With --idle it runs five, then leaves the communicator idle for `seconds`
// (nothing in flight, no call but ncclCommGetAsyncError every 100 ms, as
// PyTorch's watchdog polls) and fails as soon as that reports an error: a
// peer lost between collectives must show there (the idle check,
// SHOAL_IDLE_CHECK_MS).
// With --shrink, a failed allreduce is survived on the node of rank 0 (where
// the bootstrap root lives): its ranks shrink the communicator around every
// rank of another node (ncclCommShrink, NCCL_SHRINK_ABORT), print how long
// that took, run 500 checked allreduces on the smaller communicator and
// print "survived"; ranks of other nodes fail as below
// (cluster.sh --link-down-require survive).
// When a call fails it prints one line naming the rank, its host, the call,
// the time since start and since the last completed call, and the library's
// error text (which should name the peers it waited on), then leaves at once
// with status 1: no MPI_Abort (that would end the other ranks before they
// report their own error) and no MPI_Finalize (that would wait for the ranks
// cut off). cluster.sh --link-down-after keeps the job alive meanwhile.
//
// Uses only <nccl.h> and MPI, so it also builds against NVIDIA's NCCL.
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// --shrink: allreduces every survivor runs on the shrunk communicator (the
// same count on each, so that none destroys it while another still uses it).
constexpr long kAfterShrink = 500;

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string hostName() {
  const char* id = std::getenv("NCCL_HOSTID");
  if (id != nullptr && *id != '\0') return id;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

[[noreturn]] void fail(int rank, const std::string& host, const char* what, ncclResult_t result,
                       long done, double sinceStart, double sinceLast) {
  const char* last = ncclGetLastError(nullptr);
  std::printf("link_probe: rank %d (host %s): %s failed after %.1f s (%ld allreduces done, last one "
              "%.1f s ago): %s / %s\n",
              rank, host.c_str(), what, sinceStart, done, sinceLast, ncclGetErrorString(result),
              last != nullptr ? last : "");
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const bool idle = argc > 1 && std::string(argv[1]) == "--idle";
  const bool shrink = argc > 1 && std::string(argv[1]) == "--shrink";
  if (idle || shrink) {
    --argc;
    ++argv;
  }
  const double seconds = argc > 1 ? std::atof(argv[1]) : 60.0;
  const size_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 0) : (1u << 20);
  const size_t count = bytes / sizeof(float);
  const std::string host = hostName();

  ncclUniqueId id{};
  if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
    std::printf("link_probe: rank 0: ncclGetUniqueId failed: %s\n", ncclGetLastError(nullptr));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  // Every rank's host, for --shrink: the ranks of rank 0's node survive.
  std::vector<char> hosts(static_cast<size_t>(size) * 64, 0);
  {
    char mine[64] = {};
    std::strncpy(mine, host.c_str(), sizeof(mine) - 1);
    MPI_Allgather(mine, 64, MPI_CHAR, hosts.data(), 64, MPI_CHAR, MPI_COMM_WORLD);
  }
  auto hostOf = [&](int r) { return std::string(hosts.data() + static_cast<size_t>(r) * 64); };

  const Clock::time_point start = Clock::now();
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRank(&comm, size, id, rank);
  if (result != ncclSuccess) fail(rank, host, "ncclCommInitRank", result, 0, secondsSince(start), 0);

  // Host memory the probe writes and reads itself (ncclMemAlloc gives device
  // memory where MPI loaded CUDA).
  std::vector<float> sendBuffer(count), recvBuffer(count);
  float* in = sendBuffer.data();
  float* out = recvBuffer.data();
  void* send = in;
  void* recv = out;
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank + 1);
  const float expected = static_cast<float>(size) * static_cast<float>(size + 1) / 2;
  MPI_Barrier(MPI_COMM_WORLD);
  std::printf("link_probe: rank %d (host %s): communicator of %d ranks ready after %.1f s\n", rank,
              host.c_str(), size, secondsSince(start));
  std::fflush(stdout);

  long done = 0;
  Clock::time_point last = Clock::now();
  while (idle ? done < 5 : secondsSince(start) < seconds) {
    result = ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, nullptr);
    if (result != ncclSuccess && shrink && hostOf(rank) == hostOf(0)) {
      std::printf("link_probe: rank %d (host %s): allreduce failed after %.1f s (%ld done, last one %.1f s "
                  "ago): %s\n",
                  rank, host.c_str(), secondsSince(start), done, secondsSince(last), ncclGetLastError(nullptr));
      std::fflush(stdout);
      std::vector<int> excluded;
      for (int r = 0; r < size; ++r)
        if (hostOf(r) != hostOf(0)) excluded.push_back(r);
      const Clock::time_point shrinkStart = Clock::now();
      ncclComm_t smaller = nullptr;
      result = ncclCommShrink(comm, excluded.data(), static_cast<int>(excluded.size()), &smaller, nullptr,
                              NCCL_SHRINK_ABORT);
      if (result != ncclSuccess)
        fail(rank, host, "ncclCommShrink", result, done, secondsSince(start), secondsSince(last));
      int newRank = 0, newSize = 0;
      ncclCommUserRank(smaller, &newRank);
      ncclCommCount(smaller, &newSize);
      const double shrinkSeconds = secondsSince(shrinkStart);
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(newRank + 1);
      const float expectedNow = static_cast<float>(newSize) * static_cast<float>(newSize + 1) / 2;
      long after = 0;
      double firstSeconds = 0;
      while (after < kAfterShrink) {
        result = ncclAllReduce(send, recv, count, ncclFloat, ncclSum, smaller, nullptr);
        if (result != ncclSuccess)
          fail(rank, host, "ncclAllReduce after the shrink", result, after, secondsSince(start), secondsSince(last));
        for (size_t i = 0; i < count; i += 997) {
          if (out[i] != expectedNow) {
            std::printf("link_probe: rank %d (host %s): wrong result after the shrink at %zu: %g, expected %g\n",
                        rank, host.c_str(), i, static_cast<double>(out[i]), static_cast<double>(expectedNow));
            std::fflush(stdout);
            _exit(1);
          }
        }
        if (after++ == 0) firstSeconds = secondsSince(last);
      }
      std::printf("link_probe: rank %d (host %s): survived: shrank to rank %d of %d in %.3f s; first correct "
                  "allreduce %.1f s after the last one before the cut; %ld allreduces after the shrink, all correct\n",
                  rank, host.c_str(), newRank, newSize, shrinkSeconds, firstSeconds, after);
      std::fflush(stdout);
      // No destroy of the parent, no MPI_Finalize: both would wait for the
      // ranks beyond the cut.
      ncclCommDestroy(smaller);
      _exit(0);
    }
    if (result != ncclSuccess)
      fail(rank, host, "ncclAllReduce", result, done, secondsSince(start), secondsSince(last));
    for (size_t i = 0; i < count; i += 997) {
      if (out[i] != expected) {
        std::printf("link_probe: rank %d (host %s): wrong result at %zu: %g, expected %g\n", rank,
                    host.c_str(), i, static_cast<double>(out[i]), static_cast<double>(expected));
        std::fflush(stdout);
        _exit(1);
      }
    }
    ++done;
    last = Clock::now();
    // Tells cluster.sh this rank is in its loop: the link is cut a set time
    // after every rank got here, however long start-up took.
    if (done == (idle ? 5 : 1)) {
      if (const char* ready = std::getenv("SHOAL_TEST_READY_FILE")) {
        if (FILE* f = std::fopen(ready, "w")) std::fclose(f);
      }
    }
  }
  if (idle) {
    std::printf("link_probe: rank %d (host %s): %ld allreduces done, now idle\n", rank, host.c_str(), done);
    std::fflush(stdout);
    const Clock::time_point idleStart = Clock::now();
    while (secondsSince(idleStart) < seconds) {
      ncclResult_t state = ncclSuccess;
      result = ncclCommGetAsyncError(comm, &state);
      if (result != ncclSuccess)
        fail(rank, host, "ncclCommGetAsyncError", result, done, secondsSince(start), secondsSince(last));
      if (state != ncclSuccess && state != ncclInProgress)
        fail(rank, host, "the idle communicator (ncclCommGetAsyncError)", state, done, secondsSince(start),
             secondsSince(last));
      usleep(100000);
    }
    std::printf("link_probe: rank %d (host %s): idle for %.0f s without an error\n", rank, host.c_str(),
                seconds);
  }
  std::printf("link_probe: rank %d (host %s): %ld allreduces of %zu bytes in %.1f s, all correct\n", rank,
              host.c_str(), done, bytes, secondsSince(start));
  ncclCommDestroy(comm);
  MPI_Finalize();
  return 0;
}
