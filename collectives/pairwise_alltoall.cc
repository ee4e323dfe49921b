// Pairwise AlltoAll.
//
// Vocabulary:
//   block    count elements: block j of sendbuff goes to rank j; rank i's data
//            lands in block i of recvbuff.
//   round    r = 1..p-1: send block rank+r to rank+r, receive block rank-r from
//            rank-r (communicator ranks, not ring order). The own block is
//            copied locally.
//   window   at most kRoundsInFlight rounds run at once: round r waits for round
//            r - kRoundsInFlight, bounding the messages in flight to 2*window.
//   channel  every block is split into the same contiguous parts, one per channel.
// Never in place (NCCL does not support it).
#include <algorithm>

#include "collectives/builders.h"
#include "collectives/builder_util.h"
#include "collectives/patterns/ring.h"

namespace shoal {

using namespace build;

namespace {
constexpr int kRoundsInFlight = 4;
}

Plan buildPairwiseAllToAll(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  StepEmitter e(shape, view, "pairwise");
  const int p = view.nranks;
  const int me = view.rank;
  const uint64_t elemSize = e.elemSize();
  const uint64_t granule = patterns::lineGranule(elemSize);
  const uint64_t blockBytes = shape.count * elemSize;
  if (shape.count == 0) return e.finish();

  e.copy(recvAt(me * blockBytes), sendAt(me * blockBytes), blockBytes);
  const auto parts = channelParts(shape.count, params, granule);
  std::vector<std::vector<uint32_t>> roundSteps(p);
  for (int r = 1; r < p; ++r) {
    const int to = patterns::wrap(me + r, p);
    const int from = patterns::wrap(me - r, p);
    const std::vector<uint32_t> window =
        r > kRoundsInFlight ? roundSteps[r - kRoundsInFlight] : std::vector<uint32_t>{};
    for (const ChannelPart& part : parts) {
      const uint64_t inBlock = part.elems.begin * elemSize;
      const uint64_t bytes = part.elems.count * elemSize;
      roundSteps[r].push_back(
          e.send(to, part.channel, sendAt(to * blockBytes + inBlock), bytes, window));
      roundSteps[r].push_back(
          e.recv(from, part.channel, recvAt(from * blockBytes + inBlock), bytes, window));
    }
  }
  return e.finish();
}

}  // namespace shoal
