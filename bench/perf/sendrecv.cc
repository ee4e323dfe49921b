// sendrecv_perf: nccl-tests' SendRecv benchmark over Shoal's public C API.
// Each rank sends to rank+1 and receives from rank-1 in one group; in place
// is run and timed but not checked, as in nccl-tests. busbw = algbw.
#include "common.h"

namespace {
using namespace shoal::perf;

int nextRank(int rank, int nranks) { return (rank + 1) % nranks; }
int previousRank(int rank, int nranks) { return (rank - 1 + nranks) % nranks; }

ncclResult_t sendToNextReceiveFromPrevious(const LaunchArgs& a) {
  ncclResult_t result = ncclGroupStart();
  if (result != ncclSuccess) return result;
  result = ncclSend(a.sendbuff, a.count, a.type, nextRank(a.rank, a.nranks), a.comm, a.stream);
  if (result == ncclSuccess) {
    result = ncclRecv(a.recvbuff, a.count, a.type, previousRank(a.rank, a.nranks), a.comm,
                      a.stream);
  }
  const ncclResult_t end = ncclGroupEnd();
  return result != ncclSuccess ? result : end;
}

constexpr CollectiveSpec kSendRecv = {
    .name = "SendRecv",
    .reduces = false,
    .rooted = false,
    .checksInPlace = false,
    .onlyRootReceives = false,
    .shape = [](size_t count, size_t, int) {
      return BufferShape{.sendCount = count, .recvCount = count, .paramCount = count};
    },
    .algBytes = algBytesOnce,
    .busBwFactor = busBwOne,
    .source = [](int rank, size_t k, size_t, int nranks, int) {
      return ElementSource::fromRank(previousRank(rank, nranks), k);
    },
    .launch = sendToNextReceiveFromPrevious,
    // Each rank talks to two peers only (nccl-tests sets this too).
    .configure = [](ncclConfig_t* config) { config->maxP2pPeers = 2; },
};

}  // namespace

int main(int argc, char** argv) { return runPerf(argc, argv, kSendRecv); }
