// Plan and Step: a collective algorithm as data (docs/design.md, Plans).
//
// Role: a builder (collectives/<algorithm>.cc) is a pure function from
// (CollShape, RankView, AlgoParams) to the Plan one rank executes. A Plan does no
// I/O and knows no transport or pointer: it names byte ranges of abstract
// buffers. The engine (src/engine) runs it; the verifier (plan_verify.h) checks a
// set of plans, one per rank, in tests and debug builds. Plans are immutable once
// built and shared (cached) between calls; nothing here is thread-affine.
//
// Vocabulary used by every builder:
//   buffer   one of the op's buffers: kSendBuffer (user input), kRecvBuffer (user
//            output) or kScratchBuffer (engine-provided, plan.scratchBytes long).
//            Send and recv may alias in user calls (in-place variants at
//            NCCL's offsets, collectives/layout.h); builders must be correct when they do: never write
//            a recv byte whose send byte at the same address is still to be read.
//            Plans with Plan::readsPeers may also name, for reading only,
//            another rank's send or recv buffer of the same op
//            (peerBuffer(q, b)) and the engine's window area (kWindowBuffer),
//            where the engine writes this rank's buffer descriptor (slot 0) and
//            where peers' descriptors are received (slot 1 + q).
//   slice    (buffer, byte offset); with a byte count it names a byte range.
//   step     one unit of work: Send, Recv, Reduce, Copy or Divide.
//   lane     the ordered message stream to one peer on one channel in one
//            direction. The engine posts a lane's steps in step-index order, and the
//            peer posts the matching steps in the same order: the k-th Send to P on
//            channel c matches P's k-th Recv from us on channel c. Messages match by
//            order; the tag only checks it, so byte counts must be equal.
//   channel  an index of parallel lanes to the same peer (striping across sockets
//            or NICs). kP2pChannel is reserved for Send/Recv operations so that
//            point-to-point order never interleaves with collective order.
//   op       index of the user operation a step belongs to (several in a group).
//
// Step semantics (bytes is always a multiple of the element size):
//   Send    send [src, src+bytes) to `peer` on `channel`.
//   Recv    receive exactly `bytes` from `peer` on `channel` into dst.
//   Reduce  dst[i] = combine(src[i], src2[i]) elementwise with the plan's
//           ReduceOp; for kPreMulSum, with kScaleSrc set:  dst = src*scalar + src2,
//           without it:                                    dst = src + src2.
//           src is "local" data, src2 a partial result from elsewhere. dst may
//           equal src or src2 (exactly, not partially overlapping).
//   Copy    dst = src; with kScaleSrc and kPreMulSum: dst = src*scalar.
//           A plain copy (no kScaleSrc) whose source and destination resolve to
//           the same address is a no-op (in-place calls); a scaling copy there
//           scales in place and must run.
//   Divide  dst = src / divisor (integer kAvg: sum first, divide once at the end).
//   Steps may have bytes == 0 (a zero-count Send/Recv is still a matched
//   message); a collective with count 0 has an empty plan (no steps).
// A step starts when all its dependencies have completed. A Send completes when
// its source may be overwritten, a Recv when its data is in place.
// Dependencies always point to lower step indices (steps are topologically
// sorted). Work that must not overlap (two writes to one byte, a read of bytes
// being written) must be ordered by dependencies; the verifier checks this.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/types.h"

namespace shoal {

// A buffer's number in a plan (Slice::buffer) and an operation's index in a
// merged plan (Step::op): 32 bits, so a group of any size a process can hold
// numbers its operations' buffers (three each) below kWindowBuffer.
using BufferId = uint32_t;
using OpIndex = uint32_t;

inline constexpr BufferId kSendBuffer = 0;
inline constexpr BufferId kRecvBuffer = 1;
inline constexpr BufferId kScratchBuffer = 2;
inline constexpr int kBuffersPerOp = 3;
inline constexpr uint16_t kP2pChannel = 0xffff;

// Buffers of peer-reading plans: the window and the peers' buffers of the
// plan's one peer-reading operation (Plan::peerReadOp).
inline constexpr BufferId kWindowBuffer = 0x3fffffff;
// Operations a merged plan holds: their buffers (kBuffersPerOp each) stay
// below kWindowBuffer. About 358 million: the group's own records run out
// of memory first.
inline constexpr size_t kMaxMergedOps = kWindowBuffer / kBuffersPerOp;
inline constexpr BufferId kPeerBufferBase = 0x40000000;
inline constexpr uint64_t kWindowSlotBytes = 64;  // one buffer descriptor
inline constexpr BufferId peerBuffer(int peer, BufferId b) {
  return static_cast<BufferId>(kPeerBufferBase + static_cast<BufferId>(peer) * 2 + (b == kRecvBuffer ? 1 : 0));
}
inline constexpr bool isPeerBuffer(BufferId buffer) { return buffer >= kPeerBufferBase; }
inline constexpr int peerOfBuffer(BufferId buffer) { return static_cast<int>((buffer - kPeerBufferBase) / 2); }
inline constexpr BufferId localKindOfPeerBuffer(BufferId buffer) {
  return (buffer - kPeerBufferBase) % 2 == 0 ? kSendBuffer : kRecvBuffer;
}

struct Slice {
  BufferId buffer = kSendBuffer;  // kSendBuffer.. ; op k of a merged plan uses 3k + b
  uint64_t offset = 0;            // bytes
};

enum class StepKind : uint8_t { kSend, kRecv, kReduce, kCopy, kDivide };
const char* stepKindName(StepKind kind);

inline constexpr uint8_t kScaleSrc = 0x1;

struct Step {
  StepKind kind = StepKind::kCopy;
  uint8_t flags = 0;
  uint16_t channel = 0;
  OpIndex op = 0;        // which operation of a merged (group) plan
  int32_t peer = -1;     // Send/Recv: communicator rank of the other side
  Slice dst;             // Recv, Reduce, Copy, Divide
  Slice src;             // Send, Reduce, Copy, Divide
  Slice src2;            // Reduce
  uint64_t bytes = 0;
  uint32_t depBegin = 0; // dependencies: plan.deps[depBegin, depBegin + depCount)
  uint32_t depCount = 0;
  // Filled by finalizePlan(): lane index and position of a Send/Recv in its lane.
  int32_t lane = -1;
  uint32_t laneSeq = 0;
};

struct Lane {
  int32_t peer = -1;
  uint16_t channel = 0;
  bool isSend = false;
  std::vector<uint32_t> steps;  // in posting order
};

// What one user operation asks for, as the builders see it.
struct CollShape {
  CollKind kind = CollKind::kAllReduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  // Elements per NCCL's argument convention: AllReduce/Broadcast/Reduce: count;
  // AllGather: sendcount; ReduceScatter: recvcount; AlltoAll/Gather/Scatter: count
  // per rank; Send/Recv: count.
  uint64_t count = 0;
  int root = -1;         // Broadcast, Reduce, Gather, Scatter
  int peer = -1;         // Send, Recv
  uint64_t divisor = 0;  // > 1: integer average, divide the reduced result by it
  // The call's send and recv buffers share no byte on this rank (set from the
  // call's buffers: buffersMayOverlap in collectives/layout.h). Only then may a
  // plan treat them as separate memory; a plan built for false is right both
  // in place (NCCL's offsets) and out of place.
  bool disjointBuffers = false;
};

// The rank's view of the communicator, as algorithms need it.
struct RankView {
  int rank = 0;
  int nranks = 1;
  std::vector<int> ring;  // ring order of communicator ranks (identity by default)
  // Every peer's memory is readable from this rank (same process, or a
  // same-host process this one may read): peer-reading algorithms apply.
  bool peerReads = false;
  // The buffers are device memory that compute steps reach through
  // mappings (peer-reading device plans on windows): peer-reading plans
  // then work in whole blocks, as no CPU cache bounds a step.
  bool deviceMemory = false;
  // A node's ranks outnumber its cores: they take turns on them, so no two
  // ranks can be counted on to run at the same time.
  bool ranksTakeTurns = false;
  // Node (host) index of every rank, when known (empty: one node).
  std::vector<int> nodeOf;

  bool knowsNodes() const { return nodeOf.size() == static_cast<size_t>(nranks); }
  // How many nodes nodeOf numbers (1 when it is empty).
  int nodeCount() const {
    int nodes = 1;
    for (int n : nodeOf) nodes = n + 1 > nodes ? n + 1 : nodes;
    return nodes;
  }
};

struct AlgoParams {
  int channels = 1;              // parallel lanes per peer
  uint64_t segmentBytes = 1 << 20;  // pipelining unit of ring/chain algorithms
};

struct Plan {
  std::vector<CollShape> shapes;   // one per op (a builder makes one)
  std::string algorithm;           // e.g. "ring", "pairwise"; merged: "a+b"
  int rank = 0;
  int nranks = 1;
  // Total scratch the engine provides; op k's scratch buffer (3k+2) starts at
  // scratchOffsets[k] of it (a builder leaves scratchOffsets = {0}).
  uint64_t scratchBytes = 0;
  std::vector<uint64_t> scratchOffsets{0};
  std::vector<Step> steps;
  std::vector<uint32_t> deps;
  std::vector<Lane> lanes;         // filled by finalizePlan()
  // Reads peers' buffers (peerBuffer()); the engine exchanges descriptors
  // through kWindowBuffer, which holds (1 + nranks) slots.
  bool readsPeers = false;
  // The operation whose buffers the window describes: the one that reads
  // peers (a merged plan holds at most one).
  OpIndex peerReadOp = 0;

  // Human-readable dump, one step per line: the first debugging step.
  std::string toString() const;
};

using PlanPtr = std::shared_ptr<const Plan>;

// Computes lanes and lane sequence numbers; checks that dependencies point
// backwards (SHOAL_CHECK). Builders call it last.
void finalizePlan(Plan& plan);

// Concatenates per-op plans of one rank into one plan (a group). Op k's buffers
// b become 3k+b; its scratch lives at scratchOffsets[k] of one scratch area.
// At most one of them reads peers: the window and peer buffers are its.
Plan mergePlans(const std::vector<PlanPtr>& plans);

// One step of each kind, dependencies left empty: the only place a Step's
// fields are spelled out per kind (PlanBuilder and StepEmitter both use these).
Step sendStep(int peer, uint16_t channel, Slice src, uint64_t bytes);
Step recvStep(int peer, uint16_t channel, Slice dst, uint64_t bytes);
Step reduceStep(Slice dst, Slice src, Slice src2, uint64_t bytes, uint8_t flags);
Step copyStep(Slice dst, Slice src, uint64_t bytes, uint8_t flags);
Step divideStep(Slice dst, Slice src, uint64_t bytes);

// Builder helper: appends steps and dependencies with readable call sites.
class PlanBuilder {
 public:
  explicit PlanBuilder(Plan& plan) : plan_(plan) {}
  uint32_t send(int peer, Slice src, uint64_t bytes, std::initializer_list<uint32_t> deps = {},
                uint16_t channel = 0);
  uint32_t recv(int peer, Slice dst, uint64_t bytes, std::initializer_list<uint32_t> deps = {},
                uint16_t channel = 0);
  uint32_t reduce(Slice dst, Slice src, Slice src2, uint64_t bytes,
                  std::initializer_list<uint32_t> deps = {}, uint8_t flags = 0);
  uint32_t copy(Slice dst, Slice src, uint64_t bytes, std::initializer_list<uint32_t> deps = {},
                uint8_t flags = 0);
  uint32_t divide(Slice dst, Slice src, uint64_t bytes, std::initializer_list<uint32_t> deps = {});
  // Same with a dependency vector (dependencies computed at run time).
  uint32_t add(Step step, const std::vector<uint32_t>& deps);

 private:
  Plan& plan_;
};

}  // namespace shoal
