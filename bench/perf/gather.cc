// gather_perf: nccl-tests' Gather benchmark over Shoal's public C API.
// Rank i's block lands at block i of the root; in place, the root's input
// already sits at its own block. busbw = algbw * (n-1)/n.
#include "common.h"

namespace {
using namespace shoal::perf;

constexpr CollectiveSpec kGather = {
    .name = "Gather",
    .reduces = false,
    .rooted = true,
    .checksInPlace = true,
    .onlyRootReceives = true,
    .shape = [](size_t count, size_t eltSize, int nranks) {
      const size_t block = alignedBlockCount(count, eltSize, nranks);
      return BufferShape{.sendCount = block,
                         .recvCount = block * static_cast<size_t>(nranks),
                         .paramCount = block,
                         .sendInPlaceOffset = block};
    },
    .algBytes = algBytesPerRank,
    .busBwFactor = busBwPeerFraction,
    .source = [](int, size_t k, size_t block, int, int) {
      return ElementSource::fromRank(static_cast<int>(k / block), k % block);
    },
    .launch = [](const LaunchArgs& a) {
      return ncclGather(a.sendbuff, a.recvbuff, a.count, a.type, a.root, a.comm, a.stream);
    },
};

}  // namespace

int main(int argc, char** argv) { return runPerf(argc, argv, kGather); }
