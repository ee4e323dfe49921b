// Every algorithm builder (one file each in collectives/), for the registry and
// tests. A builder is a pure function: the plan one rank runs for one operation.
// An operation with count 0 (collectives) gives an empty plan; NCCL discards it.
#pragma once

#include "collectives/plan.h"

namespace shoal {

// AllReduce
Plan buildRingAllReduce(const CollShape&, const RankView&, const AlgoParams&);
Plan buildRecursiveDoublingAllReduce(const CollShape&, const RankView&, const AlgoParams&);
Plan buildOneShotAllReduce(const CollShape&, const RankView&, const AlgoParams&);
Plan buildOneShotAllGather(const CollShape&, const RankView&, const AlgoParams&);
Plan buildOneShotReduceScatter(const CollShape&, const RankView&, const AlgoParams&);
// AllGather, ReduceScatter
Plan buildRingAllGather(const CollShape&, const RankView&, const AlgoParams&);
Plan buildRingReduceScatter(const CollShape&, const RankView&, const AlgoParams&);
// Latency algorithms: ceil(log2 p) messages per rank.
Plan buildBruckAllGather(const CollShape&, const RankView&, const AlgoParams&);
Plan buildBruckReduceScatter(const CollShape&, const RankView&, const AlgoParams&);
// Rooted
Plan buildChainBroadcast(const CollShape&, const RankView&, const AlgoParams&);
Plan buildChainReduce(const CollShape&, const RankView&, const AlgoParams&);
Plan buildDirectGather(const CollShape&, const RankView&, const AlgoParams&);
Plan buildDirectScatter(const CollShape&, const RankView&, const AlgoParams&);
// All-to-all and point-to-point
// Across nodes: reduce in the node, AllReduce each shard on its rail, gather
// in the node. Needs RankView::nodeOf with two or more equal nodes of 2+ ranks
// (hierarchicalApplies); otherwise it builds the flat ring.
bool hierarchicalApplies(const RankView& view);
Plan buildHierarchicalAllReduce(const CollShape&, const RankView&, const AlgoParams&);
Plan buildHierarchicalReduceScatter(const CollShape&, const RankView&, const AlgoParams&);
Plan buildHierarchicalAllGather(const CollShape&, const RankView&, const AlgoParams&);
// Same-host algorithms that read peers' buffers (RankView::peerReads).
Plan buildPeerReadAllReduce(const CollShape&, const RankView&, const AlgoParams&);
Plan buildPeerReadReduceScatter(const CollShape&, const RankView&, const AlgoParams&);
Plan buildPeerReadAllGather(const CollShape&, const RankView&, const AlgoParams&);
// One phase for small device-memory AllReduces out of place: every rank sums
// every rank's whole send buffer, in rank order, into its own receive
// buffer (no block copies, no "reduced" barrier). Not in place: a rank would
// overwrite its send buffer while peers read it. Not in the tuner's table:
// windows on the streams choose it (comm, kWindowOneShotMaxBytes).
Plan buildPeerReadOneShotAllReduce(const CollShape&, const RankView&, const AlgoParams&);
inline constexpr uint64_t kWindowOneShotMaxBytes = 256 << 10;
Plan buildPairwiseAllToAll(const CollShape&, const RankView&, const AlgoParams&);
Plan buildSendRecv(const CollShape&, const RankView&, const AlgoParams&);

}  // namespace shoal
