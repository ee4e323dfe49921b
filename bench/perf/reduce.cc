// reduce_perf: nccl-tests' Reduce benchmark over Shoal's public C API.
// The root receives the reduction of all inputs; busbw = algbw.
#include "common.h"

namespace {
using namespace shoal::perf;

constexpr CollectiveSpec kReduce = {
    .name = "Reduce",
    .reduces = true,
    .rooted = true,
    .checksInPlace = true,
    .onlyRootReceives = true,
    .shape = [](size_t count, size_t, int) {
      return BufferShape{.sendCount = count, .recvCount = count, .paramCount = count};
    },
    .algBytes = algBytesOnce,
    .busBwFactor = busBwOne,
    .source = [](int, size_t k, size_t, int, int) { return ElementSource::reduced(k); },
    .launch = [](const LaunchArgs& a) {
      return ncclReduce(a.sendbuff, a.recvbuff, a.count, a.type, a.op, a.root, a.comm, a.stream);
    },
};

}  // namespace

int main(int argc, char** argv) { return runPerf(argc, argv, kReduce); }
