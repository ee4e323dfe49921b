// all_reduce_perf: nccl-tests' AllReduce benchmark over Shoal's public C API.
// Every rank receives the reduction of all inputs; busbw = algbw * 2(n-1)/n.
#include "common.h"

namespace {
using namespace shoal::perf;

constexpr CollectiveSpec kAllReduce = {
    .name = "AllReduce",
    .reduces = true,
    .rooted = false,
    .checksInPlace = true,
    .onlyRootReceives = false,
    .shape = [](size_t count, size_t, int) {
      return BufferShape{.sendCount = count, .recvCount = count, .paramCount = count};
    },
    .algBytes = algBytesOnce,
    .busBwFactor = [](int nranks) { return 2.0 * (nranks - 1) / nranks; },
    .source = [](int, size_t k, size_t, int, int) { return ElementSource::reduced(k); },
    .launch = [](const LaunchArgs& a) {
      return ncclAllReduce(a.sendbuff, a.recvbuff, a.count, a.type, a.op, a.comm, a.stream);
    },
};

}  // namespace

int main(int argc, char** argv) { return runPerf(argc, argv, kAllReduce); }
