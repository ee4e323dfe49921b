// Direct Gather and Scatter: every rank exchanges its block straight with the
// root.
//
// Vocabulary:
//   block    count elements. Gather: rank q's sendbuff lands in block q of the
//            root's recvbuff. Scatter: block q of the root's sendbuff lands in
//            rank q's recvbuff.
//   channel  every block is split into the same contiguous parts, one per channel.
// The root copies its own block (a no-op in place: Gather's sendbuff ==
// recvbuff + root*count, Scatter's recvbuff == sendbuff + root*count) and
// exchanges the others, starting with its ring-order successor so that roots
// spread their load. Non-roots touch only their own buffer of the two.
#include "collectives/builders.h"
#include "collectives/builder_util.h"
#include "collectives/patterns/ring.h"

namespace shoal {

using namespace build;

namespace {

Plan buildDirect(const CollShape& shape, const RankView& view, const AlgoParams& params, bool gather) {
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
      const uint64_t bytes = part.elems.count * elemSize;
      if (gather) e.send(root, part.channel, sendAt(inBlock), bytes);
      else e.recv(root, part.channel, recvAt(inBlock), bytes);
    }
    return e.finish();
  }
  if (gather) e.copy(recvAt(root * blockBytes), sendAt(0), blockBytes);
  else e.copy(recvAt(0), sendAt(root * blockBytes), blockBytes);
  for (int d = 1; d < p; ++d) {
    const int peer = patterns::wrap(root + d, p);
    for (const ChannelPart& part : parts) {
      const uint64_t atPeerBlock = peer * blockBytes + part.elems.begin * elemSize;
      const uint64_t bytes = part.elems.count * elemSize;
      if (gather) e.recv(peer, part.channel, recvAt(atPeerBlock), bytes);
      else e.send(peer, part.channel, sendAt(atPeerBlock), bytes);
    }
  }
  return e.finish();
}

}  // namespace

Plan buildDirectGather(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  return buildDirect(shape, view, params, /*gather=*/true);
}

Plan buildDirectScatter(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  return buildDirect(shape, view, params, /*gather=*/false);
}

}  // namespace shoal
