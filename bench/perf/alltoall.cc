// alltoall_perf: nccl-tests' AlltoAll benchmark over Shoal's public C API.
// Block j of rank i's input lands at block i of rank j. Like nccl-tests it
// calls ncclAlltoAll when the library is 2.28 or newer and grouped
// ncclSend/ncclRecv otherwise; in place is run and timed but not checked
// (NCCL does not support it). busbw = algbw * (n-1)/n.
#include "common.h"

namespace {
using namespace shoal::perf;

ncclResult_t alltoallBySendRecv(const LaunchArgs& a) {
  const size_t blockBytes = a.count * typeInfo(a.type).size;
  ncclResult_t result = ncclGroupStart();
  for (int peer = 0; peer < a.nranks && result == ncclSuccess; ++peer) {
    const size_t offset = static_cast<size_t>(peer) * blockBytes;
    result = ncclSend(static_cast<const char*>(a.sendbuff) + offset, a.count, a.type, peer, a.comm,
                      a.stream);
    if (result == ncclSuccess) {
      result = ncclRecv(static_cast<char*>(a.recvbuff) + offset, a.count, a.type, peer, a.comm,
                        a.stream);
    }
  }
  const ncclResult_t end = ncclGroupEnd();
  return result != ncclSuccess ? result : end;
}

constexpr CollectiveSpec kAlltoAll = {
    .name = "AlltoAll",
    .reduces = false,
    .rooted = false,
    .checksInPlace = false,
    .onlyRootReceives = false,
    .shape = [](size_t count, size_t eltSize, int nranks) {
      const size_t block = alignedBlockCount(count, eltSize, nranks);
      return BufferShape{.sendCount = block * static_cast<size_t>(nranks),
                         .recvCount = block * static_cast<size_t>(nranks),
                         .paramCount = block};
    },
    .algBytes = algBytesPerRank,
    .busBwFactor = busBwPeerFraction,
    .source = [](int rank, size_t k, size_t block, int, int) {
      return ElementSource::fromRank(static_cast<int>(k / block),
                                     static_cast<size_t>(rank) * block + k % block);
    },
    .launch = [](const LaunchArgs& a) {
      if (a.ncclVersion < NCCL_VERSION(2, 28, 0)) return alltoallBySendRecv(a);
      return ncclAlltoAll(a.sendbuff, a.recvbuff, a.count, a.type, a.comm, a.stream);
    },
};

}  // namespace

int main(int argc, char** argv) { return runPerf(argc, argv, kAlltoAll); }
