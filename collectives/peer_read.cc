// Peer-read algorithms: AllReduce, ReduceScatter and AllGather inside one
// host, where every rank can read every peer's buffers (same process, or a
// same-host process it may read: shared allocations from ncclMemAlloc are
// mapped, other memory is read with process_vm_readv; the engine decides per
// peer at run time). No data crosses a connection: connections carry only a
// 64-byte buffer descriptor per peer and zero-byte barrier messages, and each
// byte is read once from where it lives.
//
// Vocabulary:
//   block     rank q's share of the reduction: near-equal, cache-line granular
//             parts of the vector, block q reduced by rank q.
//   window    each rank sends its descriptor (engine-filled window slot 0) to
//             every peer and receives theirs into slot 1 + q; a peer's buffer
//             may be read once its descriptor has arrived: every read depends
//             on that receive itself (a later message of the same lane may
//             complete first). A rank sends its
//             descriptor when it enters the operation, so arrival also means
//             the peer's send buffer holds its input.
//   barrier   a zero-byte message to every peer and one from every peer.
//             "reduced": the sender has finished its block (AllReduce), so its
//             block may be read, and it no longer reads anyone's send buffer;
//             "done": the sender has finished reading every peer's memory, so
//             the receiver may return (and its caller reuse the buffers).
//
// AllReduce (rank r): window; block r = own + every peer's send block r,
// chained through the recv block in cache-sized chunks; "reduced"; copy every
// peer's reduced block q into recv block q once q's "reduced" has arrived;
// "done". In place, recv block q aliases send block q, which only rank q reads
// and only before its "reduced": the copy waits for exactly that.
// ReduceScatter: window; recv = own + every peer's send block r; "done".
// AllGather: window; every rank's block (own send, peers' sends) copied into
// its place chunk by chunk, in rank order on every rank (own block first, then
// each peer's whole, where ranks take turns on the cores); "done".
// kPreMulSum is not offered: each rank scales by its own scalar, which a
// reader of raw peer data does not have.
// On device memory (RankView::deviceMemory) every reduction and copy is one
// step over a whole block: each step is a kernel or a copy-engine copy the
// host waits for, and no CPU cache needs the data in pieces.
#include <algorithm>

#include "collectives/builder_util.h"
#include "collectives/builders.h"

namespace shoal {

using namespace build;

namespace {

// Reads of another rank's buffers are chunked so that a chain of reductions
// into one chunk of the recv buffer stays in the core's cache.
constexpr uint64_t kReduceChunkBytes = 128 << 10;
// AllGather's copies go in chunks that several ranks read at about the same
// time (buildPeerReadAllGather); as large as the engine's copies that stream
// past the cache (reduce::kStreamingCopyMinBytes), small enough that a rank
// a chunk behind still finds the lines in the last-level cache.
constexpr uint64_t kSharedReadChunkBytes = 4 << 20;

struct PeerReadPlan {
  Plan plan;
  PlanBuilder b{plan};
  std::vector<uint32_t> windowRecvFrom;  // per rank: step receiving its descriptor

  bool deviceMemory = false;

  PeerReadPlan(const CollShape& shape, const RankView& view, const char* name) : deviceMemory(view.deviceMemory) {
    plan.shapes = {shape};
    plan.algorithm = name;
    plan.rank = view.rank;
    plan.nranks = view.nranks;
    plan.readsPeers = true;
    windowRecvFrom.assign(static_cast<size_t>(view.nranks), 0);
  }

  // Every rank's descriptor to every other (an empty operation has no steps).
  void openWindows() {
    for (int q = 0; q < plan.nranks; ++q) {
      if (q == plan.rank) continue;
      b.send(q, Slice{kWindowBuffer, 0}, kWindowSlotBytes);
      windowRecvFrom[q] = b.recv(q, Slice{kWindowBuffer, kWindowSlotBytes * (1 + static_cast<uint64_t>(q))},
                                 kWindowSlotBytes);
    }
  }

  Plan finish() {
    finalizePlan(plan);
    return std::move(plan);
  }

  // A zero-byte message to every peer after `after`, and one from each; returns
  // the receive step per rank (the rank's own entry unused).
  std::vector<uint32_t> barrier(const std::vector<uint32_t>& after) {
    std::vector<uint32_t> from(static_cast<size_t>(plan.nranks), 0);
    for (int q = 0; q < plan.nranks; ++q) {
      if (q == plan.rank) continue;
      b.add(sendStep(q, 0, sendAt(0), 0), after);
      from[q] = b.recv(q, recvAt(0), 0);
    }
    return from;
  }

  // dst = own + sum of every peer's `peerKind` bytes at `peerOffset`, in chunks;
  // then divided for an integer average. Returns the steps that wrote dst.
  std::vector<uint32_t> reduceFromAll(Slice dst, Slice own, BufferId peerKind, uint64_t peerOffset,
                                      uint64_t bytes, uint64_t elemSize, uint64_t divisor) {
    std::vector<uint32_t> last;
    const uint64_t chunk =
        deviceMemory ? bytes : std::max<uint64_t>(kReduceChunkBytes / elemSize * elemSize, elemSize);
    for (uint64_t at = 0; at < bytes; at += chunk) {
      const uint64_t len = std::min(chunk, bytes - at);
      const Slice out{dst.buffer, dst.offset + at};
      Slice local{own.buffer, own.offset + at};
      uint32_t prev = 0;
      bool first = true;
      for (int d = 1; d < plan.nranks; ++d) {
        const int q = (plan.rank + d) % plan.nranks;  // spreads readers over peers
        const Slice theirs{peerBuffer(q, peerKind), peerOffset + at};
        std::vector<uint32_t> deps{windowRecvFrom[q]};
        if (!first) deps.push_back(prev);
        prev = b.add(reduceStep(out, local, theirs, len, 0), deps);
        local = out;
        first = false;
      }
      if (divisor > 1) prev = b.add(divideStep(out, out, len), {prev});
      last.push_back(prev);
    }
    return last;
  }
};

uint64_t granuleOf(uint64_t elemSize) { return patterns::lineGranule(elemSize); }

}  // namespace

Plan buildPeerReadAllReduce(const CollShape& shape, const RankView& view, const AlgoParams&) {
  PeerReadPlan p(shape, view, "peer_read");
  const int n = view.nranks, r = view.rank;
  const uint64_t e = dataTypeSize(shape.dtype);
  const uint64_t divisor = shape.divisor > 1 ? shape.divisor : 0;
  if (shape.count == 0) return p.finish();
  p.openWindows();
  const auto blocks = patterns::evenParts(shape.count, static_cast<uint64_t>(n), granuleOf(e));
  const uint64_t mine = blocks[r].begin * e, mineBytes = blocks[r].count * e;
  std::vector<uint32_t> reduced;
  if (n == 1) {
    reduced.push_back(divisor > 1 ? p.b.divide(recvAt(0), sendAt(0), mineBytes)
                                  : p.b.copy(recvAt(0), sendAt(0), mineBytes));
  } else if (mineBytes > 0) {
    reduced = p.reduceFromAll(recvAt(mine), sendAt(mine), kSendBuffer, mine, mineBytes, e, divisor);
  }
  std::vector<uint32_t> reducedFrom = p.barrier(reduced);
  std::vector<uint32_t> copies;
  for (int d = 1; d < n; ++d) {
    const int q = (r + d) % n;
    const uint64_t off = blocks[q].begin * e, len = blocks[q].count * e;
    if (len == 0) continue;
    // Both receives: completions of one lane's messages need not come in order
    // (a striped tcp connection finishes them on different sockets).
    copies.push_back(p.b.add(copyStep(recvAt(off), Slice{peerBuffer(q, kRecvBuffer), off}, len, 0),
                             {reducedFrom[q], p.windowRecvFrom[q]}));
  }
  std::vector<uint32_t> afterCopies = copies;
  for (int q = 0; q < n; ++q)
    if (q != r) afterCopies.push_back(reducedFrom[q]);
  p.barrier(afterCopies);
  return p.finish();
}

Plan buildPeerReadOneShotAllReduce(const CollShape& shape, const RankView& view, const AlgoParams&) {
  PeerReadPlan p(shape, view, "one_shot_read");
  const int n = view.nranks;
  const uint64_t bytes = shape.count * dataTypeSize(shape.dtype);
  if (shape.count == 0) return p.finish();
  p.openWindows();
  // ((c0 + c1) + c2) + ...: the same order, so the same bytes, on every rank.
  auto contribution = [&](int q) {
    return q == view.rank ? sendAt(0) : Slice{peerBuffer(q, kSendBuffer), 0};
  };
  auto arrived = [&](int q) {
    return q == view.rank ? std::vector<uint32_t>{} : std::vector<uint32_t>{p.windowRecvFrom[q]};
  };
  const bool divides = shape.divisor > 1;  // integer average: the sum divided once
  std::vector<uint32_t> sum;
  if (n == 1) {
    sum.push_back(divides ? p.b.divide(recvAt(0), sendAt(0), bytes) : p.b.copy(recvAt(0), sendAt(0), bytes));
  } else {
    std::vector<uint32_t> deps = arrived(0);
    for (uint32_t d : arrived(1)) deps.push_back(d);
    uint32_t prev = p.b.add(reduceStep(recvAt(0), contribution(0), contribution(1), bytes, 0), deps);
    for (int q = 2; q < n; ++q) {
      deps = arrived(q);
      deps.push_back(prev);
      prev = p.b.add(reduceStep(recvAt(0), recvAt(0), contribution(q), bytes, 0), deps);
    }
    if (divides) prev = p.b.add(divideStep(recvAt(0), recvAt(0), bytes), {prev});
    sum.push_back(prev);
  }
  p.barrier(sum);
  return p.finish();
}

Plan buildPeerReadReduceScatter(const CollShape& shape, const RankView& view, const AlgoParams&) {
  PeerReadPlan p(shape, view, "peer_read");
  const int n = view.nranks, r = view.rank;
  const uint64_t e = dataTypeSize(shape.dtype);
  const uint64_t blockBytes = shape.count * e;
  const uint64_t divisor = shape.divisor > 1 ? shape.divisor : 0;
  if (shape.count == 0) return p.finish();
  p.openWindows();
  std::vector<uint32_t> reduced;
  const uint64_t mine = static_cast<uint64_t>(r) * blockBytes;
  if (n == 1) {
    reduced.push_back(divisor > 1 ? p.b.divide(recvAt(0), sendAt(0), blockBytes)
                                  : p.b.copy(recvAt(0), sendAt(0), blockBytes));
  } else {
    reduced = p.reduceFromAll(recvAt(0), sendAt(mine), kSendBuffer, mine, blockBytes, e, divisor);
  }
  p.barrier(reduced);
  return p.finish();
}

Plan buildPeerReadAllGather(const CollShape& shape, const RankView& view, const AlgoParams&) {
  PeerReadPlan p(shape, view, "peer_read");
  const int n = view.nranks, r = view.rank;
  const uint64_t blockBytes = shape.count * dataTypeSize(shape.dtype);
  if (shape.count == 0) return p.finish();
  p.openWindows();
  // Shared order: chunk by chunk, sources in rank order, the same order on
  // every rank and each copy after the previous one. Ranks that run at the
  // same time then read the same source lines at about the same time, so one
  // brings a line from memory and the others find it in a cache (2 ranks,
  // 64 MiB: 7 % faster than block by block, where every rank read a different
  // source at any moment). Ranks that take turns on the cores do not read
  // together: there each block goes whole, own first, and each copy waits only
  // for its own window, so a rank works on while a peer it would wait for is
  // not running.
  const bool shared = !view.ranksTakeTurns && !view.deviceMemory;
  // kSharedReadChunkBytes is a multiple of every element size.
  const uint64_t chunk = shared ? kSharedReadChunkBytes : blockBytes;
  std::vector<uint32_t> copies;
  for (uint64_t at = 0; at < blockBytes; at += chunk) {
    const uint64_t len = std::min(chunk, blockBytes - at);
    for (int k = 0; k < n; ++k) {
      const int q = shared ? k : (r + k) % n;
      const Slice out = recvAt(static_cast<uint64_t>(q) * blockBytes + at);
      const Slice in = q == r ? sendAt(at) : Slice{peerBuffer(q, kSendBuffer), at};
      std::vector<uint32_t> deps;
      if (q != r) deps.push_back(p.windowRecvFrom[q]);
      if (shared && !copies.empty()) deps.push_back(copies.back());
      copies.push_back(p.b.add(copyStep(out, in, len, 0), deps));
    }
  }
  p.barrier(copies);
  return p.finish();
}

}  // namespace shoal
