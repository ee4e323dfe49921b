// Direct Gather: every rank sends its block straight to the root.
//
// Vocabulary:
//   block    count elements; rank q's sendbuff lands in block q of the root's
//            recvbuff.
//   channel  every block is split into the same contiguous parts, one per channel.
// The root copies its own block (a no-op in place: sendbuff == recvbuff +
// root*count) and receives the others, starting with its ring-order successor so
// that roots spread their load. Non-roots never touch recvbuff.
#include "collectives/builders.h"
#include "collectives/builder_util.h"
#include "collectives/patterns/ring.h"

namespace shoal {

using namespace build;

Plan buildDirectGather(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  StepEmitter e(shape, view, "direct");
  const int p = view.nranks;
  const int root = shape.root;
  const uint64_t elemSize = e.elemSize();
  const uint64_t blockBytes = shape.count * elemSize;
  if (shape.count == 0) return e.finish();
  const auto parts = channelParts(shape.count, params, patterns::lineGranule(elemSize));

  if (view.rank != root) {
    for (const ChannelPart& part : parts) {
      const uint64_t inBlock = part.elems.begin * elemSize;
      e.send(root, part.channel, sendAt(inBlock), part.elems.count * elemSize);
    }
    return e.finish();
  }
  e.copy(recvAt(root * blockBytes), sendAt(0), blockBytes);
  for (int d = 1; d < p; ++d) {
    const int from = patterns::wrap(root + d, p);
    for (const ChannelPart& part : parts) {
      const uint64_t inBlock = part.elems.begin * elemSize;
      e.recv(from, part.channel, recvAt(from * blockBytes + inBlock), part.elems.count * elemSize);
    }
  }
  return e.finish();
}

}  // namespace shoal
