// scatter_perf: nccl-tests' Scatter benchmark over Shoal's public C API.
// Block i of the root's input lands at rank i; in place, the root keeps its
// own block where it is. busbw = algbw * (n-1)/n.
#include "common.h"

namespace {
using namespace shoal::perf;

constexpr CollectiveSpec kScatter = {
    .name = "Scatter",
    .reduces = false,
    .rooted = true,
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
    .source = [](int rank, size_t k, size_t block, int, int root) {
      return ElementSource::fromRank(root, static_cast<size_t>(rank) * block + k);
    },
    .launch = [](const LaunchArgs& a) {
      return ncclScatter(a.sendbuff, a.recvbuff, a.count, a.type, a.root, a.comm, a.stream);
    },
};

}  // namespace

int main(int argc, char** argv) { return runPerf(argc, argv, kScatter); }
