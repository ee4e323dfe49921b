// reduce_scatter_perf: nccl-tests' ReduceScatter benchmark over Shoal's
// public C API. Rank i receives the reduction of block i of every input; in
// place, its result lands on its own block of the input. busbw = algbw * (n-1)/n.
#include "common.h"

namespace {
using namespace shoal::perf;

constexpr CollectiveSpec kReduceScatter = {
    .name = "ReduceScatter",
    .reduces = true,
    .rooted = false,
    .checksInPlace = true,
    .onlyRootReceives = false,
    .shape = [](size_t count, size_t eltSize, int nranks) {
      const size_t block = alignedBlockCount(count, eltSize, nranks);
      return BufferShape{.sendCount = block * static_cast<size_t>(nranks),
                         .recvCount = block,
                         .paramCount = block,
                         .recvInPlaceOffset = block};
    },
    .algBytes = algBytesPerRank,
    .busBwFactor = busBwPeerFraction,
    .source = [](int rank, size_t k, size_t block, int, int) {
      return ElementSource::reduced(static_cast<size_t>(rank) * block + k);
    },
    .launch = [](const LaunchArgs& a) {
      return ncclReduceScatter(a.sendbuff, a.recvbuff, a.count, a.type, a.op, a.comm, a.stream);
    },
};

}  // namespace

int main(int argc, char** argv) { return runPerf(argc, argv, kReduceScatter); }
