// Hierarchical AllReduce, ReduceScatter and AllGather: work inside each node
// over the fast link, cross the network once per shard with every local rank
// working in parallel (on its rail), and finish inside the node.
//
// Vocabulary (N nodes of L ranks each; RankView::nodeOf):
//   node ring  the ranks of this rank's node, in communicator-ring order.
//   rail       local rank j of every node, in node order: the ring that carries
//              block j between nodes.
//   block      1/L of a round (cache-line granular); block j is owned by local
//              rank j.
// Per channel and round: (1) ring reduce-scatter on the node ring, after which
// local rank j holds block j reduced over its node in its recv buffer; (2) ring
// AllReduce of block j on rail j, in place in the recv buffer; (3) ring
// all-gather of the blocks on the node ring. Each node's link then carries
// 2(N-1)/N of the buffer instead of a flat ring's 2(NL-1)/(NL). The phases
// are emitted one after another, but their steps depend only on the bytes
// they touch, so round r of the rail phase overlaps later rounds of the node
// phase (different lanes). Nodes of unequal size are not offered (the flat
// ring serves them); counts need not divide by L.
//
// ReduceScatter (rank (k, j) = local rank j of node k wants block (k, j)):
// (1) per node k, a node-ring reduce-scatter of node k's blocks, so local rank
// j holds node-partials of block (k', j) for every node k' (in scratch: one
// block per node); (2) rail-ring reduce-scatter of those partials: each rank
// ends with its own block. AllGather: (1) rail-ring all-gather of every
// rank's block, so local rank j holds the blocks of all rail-j ranks; (2) per
// node k, a node-ring all-gather of node k's blocks. Both move (N-1)/N of
// the output per node link, against a flat ring's (NL-1)/(NL).
#include <algorithm>

#include "collectives/builders.h"
#include "collectives/ring_phases.h"

namespace shoal {

using namespace build;

namespace {

struct Groups {
  std::vector<std::vector<int>> members;  // per node (in rail order): its ranks in ring order
  std::vector<int> node;  // this rank's node ring
  std::vector<int> rail;  // this rank's rail, node by node
  int localRank = 0;
  int localSize = 0;
};

Groups groupsOf(const RankView& view) {
  const patterns::RingOrder ring(view);
  Groups g;
  std::vector<std::vector<int>> members(static_cast<size_t>(view.nodeCount()));
  for (int pos = 0; pos < ring.size(); ++pos) {
    int r = ring.rankAt(pos);
    members[view.nodeOf[r]].push_back(r);
  }
  std::erase_if(members, [](const std::vector<int>& m) { return m.empty(); });
  for (const auto& m : members)
    if (std::find(m.begin(), m.end(), view.rank) != m.end()) g.node = m;
  g.localSize = static_cast<int>(g.node.size());
  g.localRank = static_cast<int>(std::find(g.node.begin(), g.node.end(), view.rank) - g.node.begin());
  for (const auto& m : members) g.rail.push_back(m[g.localRank]);
  g.members = std::move(members);
  return g;
}

// What every hierarchical builder derives from its arguments.
struct Hierarchy {
  Groups groups;
  patterns::RingOrder nodeRing, railRing;
  int localSize, nodes;
  uint64_t elemSize, granule, segment;  // bytes, elements, elements

  Hierarchy(const StepEmitter& e, const RankView& view, const AlgoParams& params)
      : groups(groupsOf(view)),
        nodeRing(groups.node, view.rank),
        railRing(groups.rail, view.rank),
        localSize(groups.localSize),
        nodes(static_cast<int>(groups.rail.size())),
        elemSize(e.elemSize()),
        granule(patterns::lineGranule(elemSize)),
        segment(segmentElems(params, elemSize, granule)) {}
};

// The node phase applies each rank's PreMulSum scalar to its own input; the
// rail phase then adds node sums unscaled and divides an integer average once.
struct PhaseSpecs {
  ReduceSpec node, rail;
};
PhaseSpecs phaseSpecs(const CollShape& shape) {
  PhaseSpecs p{ReduceSpec::of(shape), ReduceSpec::of(shape)};
  p.node.divisor = 0;
  p.rail.scaleLocal = false;
  return p;
}

}  // namespace

bool hierarchicalApplies(const RankView& view) {
  if (!view.knowsNodes() || view.nranks < 2) return false;
  std::vector<int> sizes;
  for (int n : view.nodeOf) {
    if (n < 0) return false;
    if (static_cast<size_t>(n) >= sizes.size()) sizes.resize(static_cast<size_t>(n) + 1, 0);
    ++sizes[n];
  }
  if (sizes.size() < 2) return false;  // one node: nothing to be hierarchical about
  return std::all_of(sizes.begin(), sizes.end(), [&](int s) { return s == sizes[0]; }) && sizes[0] > 1;
}

Plan buildHierarchicalAllReduce(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  // Without equal nodes there is no hierarchy to use: the flat ring is the plan.
  if (!hierarchicalApplies(view)) return buildRingAllReduce(shape, view, params);
  StepEmitter e(shape, view, "hierarchical");
  const Hierarchy h(e, view, params);
  const patterns::RingOrder &nodeRing = h.nodeRing, &railRing = h.railRing;
  const int L = h.localSize, N = h.nodes;
  const uint64_t elemSize = h.elemSize, granule = h.granule, segment = h.segment;
  const PhaseSpecs specs = phaseSpecs(shape);

  for (const ChannelPart& part : channelParts(shape.count, params, granule)) {
    // A round is L blocks; a block's rail AllReduce moves N chunks of it.
    const uint64_t nrounds = patterns::pieceCount(part.elems.count, segment * L);
    std::vector<RingRound> nodeRounds, railRounds, gatherRounds;
    for (uint64_t r = 0; r < nrounds; ++r) {
      const patterns::ElemRange round = patterns::evenPart(part.elems.count, nrounds, r, granule);
      const auto blocks = patterns::evenParts(round.count, static_cast<uint64_t>(L), granule);
      RingRound node, gather;
      for (const patterns::ElemRange& b : blocks) {
        const uint64_t offset = (part.elems.begin + round.begin + b.begin) * elemSize;
        node.push_back(RingChunk{sendAt(offset), recvAt(offset), b.count * elemSize});
        gather.push_back(RingChunk{recvAt(offset), recvAt(offset), b.count * elemSize});
      }
      // Node-ring position j owns block j.
      const patterns::ElemRange& mine = blocks[static_cast<size_t>(nodeRing.position())];
      RingRound rail;
      for (const patterns::ElemRange& c : patterns::evenParts(mine.count, static_cast<uint64_t>(N), granule)) {
        const uint64_t offset = (part.elems.begin + round.begin + mine.begin + c.begin) * elemSize;
        rail.push_back(RingChunk{recvAt(offset), recvAt(offset), c.count * elemSize});
      }
      nodeRounds.push_back(std::move(node));
      railRounds.push_back(std::move(rail));
      gatherRounds.push_back(std::move(gather));
    }
    emitRingChannel(e, nodeRing, part.channel, nodeRounds, RingPhases::kReduceScatter, specs.node);
    emitRingChannel(e, railRing, part.channel, railRounds, RingPhases::kAllReduce, specs.rail);
    emitRingChannel(e, nodeRing, part.channel, gatherRounds, RingPhases::kAllGather, ReduceSpec{});
  }
  return e.finish();
}

Plan buildHierarchicalReduceScatter(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  if (!hierarchicalApplies(view)) return buildRingReduceScatter(shape, view, params);
  StepEmitter e(shape, view, "hierarchical");
  const Hierarchy h(e, view, params);
  const Groups& g = h.groups;
  const patterns::RingOrder &nodeRing = h.nodeRing, &railRing = h.railRing;
  const int N = h.nodes;
  const uint64_t elemSize = h.elemSize, granule = h.granule, segment = h.segment;
  const uint64_t blockBytes = shape.count * elemSize;
  const PhaseSpecs specs = phaseSpecs(shape);
  // Node-partials of this rank's rail blocks: one block per node.
  const uint64_t partials = e.reserveScratch(static_cast<uint64_t>(N) * blockBytes);

  for (const ChannelPart& part : channelParts(shape.count, params, granule)) {
    std::vector<RingRound> nodeRounds, railRounds;
    for (const patterns::ElemRange& round : patterns::segments(part.elems.count, segment, granule)) {
      const uint64_t inBlock = (part.elems.begin + round.begin) * elemSize;
      const uint64_t bytes = round.count * elemSize;
      RingRound rail;
      for (int k = 0; k < N; ++k) {
        RingRound node;
        for (int rank : g.members[k])
          node.push_back(RingChunk{sendAt(rank * blockBytes + inBlock), scratchAt(partials + k * blockBytes + inBlock),
                                   bytes});
        nodeRounds.push_back(std::move(node));
        rail.push_back(RingChunk{scratchAt(partials + k * blockBytes + inBlock), recvAt(inBlock), bytes});
      }
      railRounds.push_back(std::move(rail));
    }
    emitRingChannel(e, nodeRing, part.channel, nodeRounds, RingPhases::kReduceScatter, specs.node);
    emitRingChannel(e, railRing, part.channel, railRounds, RingPhases::kReduceScatter, specs.rail);
  }
  return e.finish();
}

Plan buildHierarchicalAllGather(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  if (!hierarchicalApplies(view)) return buildRingAllGather(shape, view, params);
  StepEmitter e(shape, view, "hierarchical");
  const Hierarchy h(e, view, params);
  const Groups& g = h.groups;
  const patterns::RingOrder &nodeRing = h.nodeRing, &railRing = h.railRing;
  const int N = h.nodes;
  const uint64_t elemSize = h.elemSize, granule = h.granule, segment = h.segment;
  const uint64_t blockBytes = shape.count * elemSize;

  for (const ChannelPart& part : channelParts(shape.count, params, granule)) {
    std::vector<RingRound> railRounds, nodeRounds;
    for (const patterns::ElemRange& round : patterns::segments(part.elems.count, segment, granule)) {
      const uint64_t inBlock = (part.elems.begin + round.begin) * elemSize;
      const uint64_t bytes = round.count * elemSize;
      RingRound rail;
      for (int k = 0; k < N; ++k) {
        rail.push_back(RingChunk{sendAt(inBlock), recvAt(g.rail[k] * blockBytes + inBlock), bytes});
        RingRound node;
        for (int rank : g.members[k]) {
          const Slice block = recvAt(rank * blockBytes + inBlock);
          node.push_back(RingChunk{block, block, bytes});
        }
        nodeRounds.push_back(std::move(node));
      }
      railRounds.push_back(std::move(rail));
    }
    emitRingChannel(e, railRing, part.channel, railRounds, RingPhases::kAllGather, ReduceSpec{});
    emitRingChannel(e, nodeRing, part.channel, nodeRounds, RingPhases::kAllGather, ReduceSpec{});
  }
  return e.finish();
}

}  // namespace shoal
