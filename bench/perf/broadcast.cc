// broadcast_perf: nccl-tests' Broadcast benchmark over Shoal's public C API.
// Every rank receives the root's input; busbw = algbw.
#include "common.h"

namespace {
using namespace shoal::perf;

constexpr CollectiveSpec kBroadcast = {
    .name = "Broadcast",
    .reduces = false,
    .rooted = true,
    .checksInPlace = true,
    .onlyRootReceives = false,
    .shape = [](size_t count, size_t, int) {
      return BufferShape{.sendCount = count, .recvCount = count, .paramCount = count};
    },
    .algBytes = algBytesOnce,
    .busBwFactor = busBwOne,
    .source = [](int, size_t k, size_t, int, int root) { return ElementSource::fromRank(root, k); },
    .launch = [](const LaunchArgs& a) {
      return ncclBroadcast(a.sendbuff, a.recvbuff, a.count, a.type, a.root, a.comm, a.stream);
    },
};

}  // namespace

int main(int argc, char** argv) { return runPerf(argc, argv, kBroadcast); }
