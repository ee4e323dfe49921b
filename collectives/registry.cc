#include "collectives/registry.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "collectives/builders.h"
#include "collectives/patterns/bruck.h"
#include "collectives/patterns/recursive_doubling.h"
#include "collectives/patterns/ring.h"

namespace shoal {

namespace {

// Model inputs for one operation.
struct Model {
  double p;      // ranks
  double bytes;  // n of the cost table: see each estimate
  const CostParams& c;
  // Messages on the critical path, each also a wait (CostParams::reschedule_us).
  double alpha(double messages) const { return messages * (c.alpha_us + c.reschedule_us); }
  // Messages received besides those on the critical path.
  double extraWaits(double messages) const { return messages * c.reschedule_us; }
  double beta(double b) const { return b * c.beta_us_per_byte; }
  // A message or bytes that stay inside a node (CostParams).
  double alphaIntra(double messages) const {
    return messages * (c.alpha_us * c.intra_alpha_scale + c.reschedule_us);
  }
  double betaIntra(double b) const { return beta(b) * c.intra_beta_scale; }
  double gamma(double b) const { return b * c.gamma_us_per_byte_reduce; }
  double log2p() const { return std::ceil(std::log2(p)); }
};

Model model(const CollShape& s, const RankView& v, const CostParams& c, bool perRankBlocks) {
  double bytes = static_cast<double>(s.count) * static_cast<double>(dataTypeSize(s.dtype));
  if (perRankBlocks) bytes *= v.nranks;
  return Model{static_cast<double>(v.nranks), bytes, c};
}

// Whether some rank's partner at that ring distance is on another node
// (ring positions; RankView::nodeOf, empty on one node).
bool crossesNodes(const RankView& v, const patterns::RingOrder& ring, int distance) {
  if (!v.knowsNodes()) return false;
  for (int i = 0; i < ring.size(); ++i)
    if (v.nodeOf[ring.rankAt(i)] != v.nodeOf[ring.rankAt(i + distance)]) return true;
  return false;
}

bool always(const CollShape&, const RankView&) { return true; }

// One-shot algorithms are for latency-bound sizes: each message at most this
// (a block of AllGather / ReduceScatter, the buffer of AllReduce). Beyond it
// their p-1 copies of every byte through the channels lose to the peer reads
// and rings, which the linear estimate sees too late: 4 ranks on 2 cores,
// per-rank block 8 KiB one-shot 14-18 us against peer_read 21-27, 32 KiB
// level (AllGather) or behind (ReduceScatter 31-34 against 25-28), 128 KiB
// 65-99 against 40-72 (measured 2026-12-01).
constexpr uint64_t kOneShotMaxMessageBytes = 16 << 10;
bool oneShotSize(const CollShape& s, const RankView&) {
  return s.count * dataTypeSize(s.dtype) <= kOneShotMaxMessageBytes;
}

bool rootValid(const CollShape& s, const RankView& v) {
  return s.root >= 0 && s.root < v.nranks;
}

bool peerValid(const CollShape& s, const RankView& v) {
  return s.peer >= 0 && s.peer < v.nranks;
}

// n = the buffer. Reduce-scatter then all-gather: 2(p-1) messages.
double ringAllReduceCost(const CollShape& s, const RankView& v, const CostParams& c) {
  Model m = model(s, v, c, false);
  if (m.p == 1) return m.gamma(m.bytes);
  return m.alpha(2 * (m.p - 1)) + m.beta(2 * (m.p - 1) / m.p * m.bytes) +
         m.gamma((m.p - 1) / m.p * m.bytes);
}

// n = the buffer, exchanged whole every round; +2 messages to fold a
// non-power of two. Rounds whose partners all share a node (the first ones,
// on rings that keep nodes together) cost the node's link; in the others
// every rank sends n on its own stream (as the hierarchical rails do).
double recursiveDoublingAllReduceCost(const CollShape& s, const RankView& v,
                                      const CostParams& c) {
  Model m = model(s, v, c, false);
  if (m.p == 1) return m.gamma(m.bytes);
  const patterns::RingOrder ring(v);
  const patterns::RecursiveDoubling rd(v.nranks);
  double cost = 0;
  auto exchange = [&](bool inside) {
    cost += inside ? m.alphaIntra(1) + m.betaIntra(m.bytes) : m.alpha(1) + m.beta(m.bytes);
  };
  if (rd.pof2() != v.nranks) {  // fold and unfold: neighbours on the ring
    exchange(!crossesNodes(v, ring, 1));
    exchange(!crossesNodes(v, ring, 1));
  }
  for (int k = 0; k < rd.rounds(); ++k) {
    bool inside = true;
    for (int virt = 0; virt < rd.pof2() && v.knowsNodes() && inside; ++virt) {
      const int a = ring.rankAt(rd.participantOf(virt));
      const int b = ring.rankAt(rd.participantOf(rd.partner(virt, k)));
      inside = v.nodeOf[a] == v.nodeOf[b];
    }
    exchange(inside);
  }
  const double folds = rd.pof2() != v.nranks ? 1 : 0;
  return cost + m.gamma((rd.rounds() + folds) * m.bytes);
}

// One-shot (one_shot.cc): each rank sends `sent` bytes in one round. The
// p-1 messages leave together: the critical path holds one message's latency
// (and one wait, like a round of recursive doubling) plus posting the other
// p-2, at kOneShotPostAlpha of a latency each; on one node all of it stays
// inside (the node's link), else it is priced as the network.
constexpr double kOneShotPostAlpha = 0.25;
double oneShotCost(const Model& m, const RankView& v, double sent, double reduced) {
  if (m.p == 1) return m.gamma(m.bytes);
  const CostParams& c = m.c;
  const bool inside = v.nodeCount() == 1;
  const double posts = kOneShotPostAlpha * (m.p - 2) * c.alpha_us;
  if (inside) return m.alphaIntra(1) + posts * c.intra_alpha_scale + m.betaIntra(sent) + m.gamma(reduced);
  return m.alpha(1) + posts + m.beta(sent) + m.gamma(reduced);
}

// n = the buffer, sent whole to every peer; every rank copies its own
// contribution and sums p of them: p-1 reductions and one copy.
double oneShotAllReduceCost(const CollShape& s, const RankView& v, const CostParams& c) {
  Model m = model(s, v, c, false);
  return oneShotCost(m, v, (m.p - 1) * m.bytes, m.p * m.bytes);
}

// n = the gathered output (AG) or the whole input (RS): each rank sends
// (p-1)/p of it. The AllGather copies its own block; the ReduceScatter sums
// p blocks (p-1 sums and a copy).
double oneShotAllGatherCost(const CollShape& s, const RankView& v, const CostParams& c) {
  Model m = model(s, v, c, true);
  return oneShotCost(m, v, (m.p - 1) / m.p * m.bytes, m.bytes / m.p);
}
double oneShotReduceScatterCost(const CollShape& s, const RankView& v, const CostParams& c) {
  Model m = model(s, v, c, true);
  return oneShotCost(m, v, (m.p - 1) / m.p * m.bytes, m.bytes);
}

// n = the gathered output (AG) or the whole input (RS).
double ringAllGatherCost(const CollShape& s, const RankView& v, const CostParams& c) {
  Model m = model(s, v, c, true);
  return m.alpha(m.p - 1) + m.beta((m.p - 1) / m.p * m.bytes);
}

double ringReduceScatterCost(const CollShape& s, const RankView& v, const CostParams& c) {
  Model m = model(s, v, c, true);
  return m.alpha(m.p - 1) + m.beta((m.p - 1) / m.p * m.bytes) +
         m.gamma((m.p - 1) / m.p * m.bytes);
}

// Bruck: ceil(log2 p) messages; each rank sends (p-1)/p of n, but rounds
// past the node size cross nodes with several blocks at once, so the busiest
// link is the larger of a rank's bytes and its node's share of the crossings.
// Local copies (staging, and the AllGather's copy-out / the ReduceScatter's
// sums) go through the rank's thread and are counted as reduced bytes.
double bruckBusiestLinkBlocks(const RankView& v) {
  const int p = v.nranks;
  double busiest = p - 1;
  if (!v.knowsNodes()) return busiest;
  const patterns::RingOrder ring(v);
  std::vector<double> out(p, 0.0), in(p, 0.0);  // blocks leaving / entering each node
  for (const patterns::BruckRound& r : patterns::bruckRounds(p)) {
    for (int i = 0; i < p; ++i) {
      const int from = v.nodeOf[ring.rankAt(i)], to = v.nodeOf[ring.rankAt(i - r.distance)];
      if (from == to) continue;
      out[from] += r.blocks;
      in[to] += r.blocks;
    }
  }
  for (int node = 0; node < p; ++node) busiest = std::max({busiest, out[node], in[node]});
  return busiest;
}

double bruckCost(const CollShape& s, const RankView& v, const CostParams& c, bool reduces) {
  Model m = model(s, v, c, true);
  if (m.p == 1) return m.gamma(m.bytes / m.p);
  const double block = m.bytes / m.p;
  const patterns::RingOrder ring(v);
  double latency = 0;
  for (const patterns::BruckRound& r : patterns::bruckRounds(v.nranks))
    latency += crossesNodes(v, ring, -r.distance) ? m.alpha(1) : m.alphaIntra(1);
  const double copies = reduces ? 2 * (m.p - 1) * block : (m.p - 1) * block;
  return latency + m.beta(bruckBusiestLinkBlocks(v) * block) + m.gamma(copies);
}
double bruckAllGatherCost(const CollShape& s, const RankView& v, const CostParams& c) {
  return bruckCost(s, v, c, false);
}
double bruckReduceScatterCost(const CollShape& s, const RankView& v, const CostParams& c) {
  return bruckCost(s, v, c, true);
}

// Pipelined chain: p-1 hops of latency, the buffer once over each link.
double chainBroadcastCost(const CollShape& s, const RankView& v, const CostParams& c) {
  Model m = model(s, v, c, false);
  if (m.p == 1) return m.gamma(m.bytes);  // a local copy
  return m.alpha(m.p - 1) + m.beta(m.bytes);
}

double chainReduceCost(const CollShape& s, const RankView& v, const CostParams& c) {
  Model m = model(s, v, c, false);
  if (m.p == 1) return m.gamma(m.bytes);
  return m.alpha(m.p - 1) + m.beta(m.bytes) + m.gamma(m.bytes);
}

// n = all blocks; the root's link carries (p-1)/p of it.
double directRootedCost(const CollShape& s, const RankView& v, const CostParams& c) {
  Model m = model(s, v, c, true);
  return m.alpha(m.p - 1) + m.beta((m.p - 1) / m.p * m.bytes);
}

double pairwiseAllToAllCost(const CollShape& s, const RankView& v, const CostParams& c) {
  Model m = model(s, v, c, true);
  return m.alpha(m.p - 1) + m.beta((m.p - 1) / m.p * m.bytes);
}

// Peer reads: `rounds` of one zero- or 64-byte message per peer (window and
// barriers: the round waits for all p-1 of them), and (p-1)/p of n read from
// peers per read phase. A byte read from a peer costs one memory copy, while a
// link (even shared memory) moves it into and out of a channel: modelled as
// half a link byte. Each read of a peer's buffer also costs a fixed setup
// (descriptor lookup, mapping), kPeerReadSetup messages' latency: measured 2
// ranks, ncclMemAlloc buffers, 8 B AllReduce 2.4 us for peer_read against
// 0.74 for recursive doubling (one round) and 1.1 for the ring (two), so
// little beyond its three rounds.
constexpr double kPeerReadSetup = 0.25;
double peerReadCost(const Model& m, double rounds, double readPhases, bool reduces) {
  double read = (m.p - 1) / m.p * m.bytes;
  double setups = readPhases * (m.p - 1) * kPeerReadSetup;
  return m.alpha(rounds) + m.extraWaits(rounds * (m.p - 2)) + setups * m.c.alpha_us +
         m.beta(readPhases * read) / 2 + (reduces ? m.gamma(read) : 0);
}

double peerReadAllReduceCost(const CollShape& s, const RankView& v, const CostParams& c) {
  return peerReadCost(model(s, v, c, false), 3, 2, true);
}

double peerReadReduceScatterCost(const CollShape& s, const RankView& v, const CostParams& c) {
  return peerReadCost(model(s, v, c, true), 2, 1, true);
}

double peerReadAllGatherCost(const CollShape& s, const RankView& v, const CostParams& c) {
  return peerReadCost(model(s, v, c, true), 2, 1, false);
}

// N nodes of L ranks: 2(L-1) node-ring messages and 2(N-1) rail messages.
// The node phases move 2(L-1)/L of the buffer inside the node; across nodes
// each rank carries only its 1/L shard, 2(N-1)/N of it, on its own rail, the
// L rails in parallel (one network stream each; a flat ring crosses each
// node boundary through one rank's stream). Measured on emulated nodes
// (docs/performance.md), unlimited veth and 1 Gbit/s alike.
double hierarchicalAllReduceCost(const CollShape& s, const RankView& v, const CostParams& c) {
  Model m = model(s, v, c, false);
  const double N = v.nodeCount(), L = m.p / N;
  return m.alphaIntra(2 * (L - 1)) + m.alpha(2 * (N - 1)) + m.beta(2 * (N - 1) / N * m.bytes / L) +
         m.betaIntra(2 * (L - 1) / L * m.bytes) + m.gamma((m.p - 1) / m.p * m.bytes);
}

// AllGather / ReduceScatter (n = the whole output / input): each rank's rail
// carries (N-1)/N of its shard; the node phase moves (L-1)/L of n inside the node.
double hierarchicalGatherCost(const CollShape& s, const RankView& v, const CostParams& c, bool reduces) {
  Model m = model(s, v, c, true);
  const double N = v.nodeCount(), L = m.p / N;
  return m.alphaIntra(L - 1) + m.alpha(N - 1) + m.beta((N - 1) / N * m.bytes / L) +
         m.betaIntra((L - 1) / L * m.bytes) + (reduces ? m.gamma((m.p - 1) / m.p * m.bytes) : 0);
}
double hierarchicalAllGatherCost(const CollShape& s, const RankView& v, const CostParams& c) {
  return hierarchicalGatherCost(s, v, c, false);
}
double hierarchicalReduceScatterCost(const CollShape& s, const RankView& v, const CostParams& c) {
  return hierarchicalGatherCost(s, v, c, true);
}

bool hierarchical(const CollShape&, const RankView& v) { return hierarchicalApplies(v); }

// Every peer's memory readable, more than one rank, and no per-rank scalar
// (kPreMulSum scales each rank's input by that rank's own scalar).
bool peerReadable(const CollShape& s, const RankView& v) {
  return v.peerReads && v.nranks > 1 && s.op != ReduceOp::kPreMulSum;
}

double sendRecvCost(const CollShape& s, const RankView& v, const CostParams& c) {
  Model m = model(s, v, c, false);
  return m.alpha(1) + m.beta(m.bytes);
}

}  // namespace

const std::vector<AlgorithmEntry>& algorithms() {
  static const std::vector<AlgorithmEntry> kTable = {
      {CollKind::kAllReduce, "ring", buildRingAllReduce, always, ringAllReduceCost},
      {CollKind::kAllReduce, "recursive_doubling", buildRecursiveDoublingAllReduce, always,
       recursiveDoublingAllReduceCost},
      {CollKind::kAllReduce, "one_shot", buildOneShotAllReduce, oneShotSize, oneShotAllReduceCost},
      {CollKind::kAllReduce, "hierarchical", buildHierarchicalAllReduce, hierarchical,
       hierarchicalAllReduceCost},
      {CollKind::kAllReduce, "peer_read", buildPeerReadAllReduce, peerReadable, peerReadAllReduceCost},
      {CollKind::kAllGather, "ring", buildRingAllGather, always, ringAllGatherCost},
      {CollKind::kAllGather, "bruck", buildBruckAllGather, always, bruckAllGatherCost},
      {CollKind::kAllGather, "one_shot", buildOneShotAllGather, oneShotSize, oneShotAllGatherCost},
      {CollKind::kAllGather, "hierarchical", buildHierarchicalAllGather, hierarchical, hierarchicalAllGatherCost},
      {CollKind::kAllGather, "peer_read", buildPeerReadAllGather, peerReadable, peerReadAllGatherCost},
      {CollKind::kReduceScatter, "ring", buildRingReduceScatter, always, ringReduceScatterCost},
      {CollKind::kReduceScatter, "bruck", buildBruckReduceScatter, always, bruckReduceScatterCost},
      {CollKind::kReduceScatter, "one_shot", buildOneShotReduceScatter, oneShotSize, oneShotReduceScatterCost},
      {CollKind::kReduceScatter, "hierarchical", buildHierarchicalReduceScatter, hierarchical,
       hierarchicalReduceScatterCost},
      {CollKind::kReduceScatter, "peer_read", buildPeerReadReduceScatter, peerReadable,
       peerReadReduceScatterCost},
      {CollKind::kBroadcast, "chain", buildChainBroadcast, rootValid, chainBroadcastCost},
      {CollKind::kReduce, "chain", buildChainReduce, rootValid, chainReduceCost},
      {CollKind::kAllToAll, "pairwise", buildPairwiseAllToAll, always, pairwiseAllToAllCost},
      {CollKind::kGather, "direct", buildDirectGather, rootValid, directRootedCost},
      {CollKind::kScatter, "direct", buildDirectScatter, rootValid, directRootedCost},
      {CollKind::kSend, "p2p", buildSendRecv, peerValid, sendRecvCost},
      {CollKind::kRecv, "p2p", buildSendRecv, peerValid, sendRecvCost},
  };
  return kTable;
}

const AlgorithmEntry* findAlgorithm(CollKind kind, std::string_view name) {
  for (const AlgorithmEntry& e : algorithms()) {
    if (e.kind == kind && name == e.name) return &e;
  }
  return nullptr;
}

std::vector<const AlgorithmEntry*> candidates(CollKind kind) {
  std::vector<const AlgorithmEntry*> out;
  for (const AlgorithmEntry& e : algorithms()) {
    if (e.kind == kind) out.push_back(&e);
  }
  return out;
}

}  // namespace shoal
