// Builder utilities shared by every algorithm in collectives/ (docs/design.md, Plans).
//
// Role: used only inside builders, on the caller's thread, for one plan at a time.
//
// StepEmitter appends steps and derives their dependencies from the bytes they
// touch: a step depends on every earlier step that wrote bytes it reads or
// writes, and on every earlier step that read bytes it writes (RAW, WAW, WAR).
// It knows the collective's in-place offset (collectives/layout.h) and treats
// send and recv bytes that would share an address in an in-place call as the
// same bytes, also for a shape with disjoint buffers: every plan keeps the
// order of an in-place one, the order the transports were measured with
// (decision 0014). What may differ by placement is where a builder puts data
// (shape().disjointBuffers). Builders add
// explicit dependencies only for ordering that is not about data (e.g. a window
// of rounds in flight). Emission order matters: it is the step order, hence the
// order of every lane; builders emit in a global "time" order that every rank
// shares, so that all dependencies point to earlier time (no deadlock).
//
// SlotPool hands out fixed-size scratch slots for data in flight; a slot is
// reused only once its last reader is `reuseDistance` time units in the past, so
// reuse never makes a step wait for a step of the same or a later time.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "collectives/layout.h"
#include "collectives/patterns/chunking.h"
#include "collectives/plan.h"

namespace shoal::build {

inline Slice sendAt(uint64_t offset) { return Slice{kSendBuffer, offset}; }
inline Slice recvAt(uint64_t offset) { return Slice{kRecvBuffer, offset}; }
inline Slice scratchAt(uint64_t offset) { return Slice{kScratchBuffer, offset}; }
inline uint64_t alignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// How local data enters a reduction and how the result ends.
struct ReduceSpec {
  bool scaleLocal = false;  // kPreMulSum: local data enters exactly once, times the scalar
  uint64_t divisor = 0;     // > 1: integer average, divide the full sum once

  static ReduceSpec of(const CollShape& shape) {
    return ReduceSpec{shape.op == ReduceOp::kPreMulSum, shape.divisor > 1 ? shape.divisor : 0};
  }
  uint8_t localFlags() const { return scaleLocal ? kScaleSrc : 0; }
};

class StepEmitter {
 public:
  StepEmitter(const CollShape& shape, const RankView& view, std::string algorithm);

  const CollShape& shape() const { return plan_.shapes[0]; }
  int rank() const { return plan_.rank; }
  int nranks() const { return plan_.nranks; }
  uint64_t elemSize() const { return dataTypeSize(shape().dtype); }

  // Each returns the new step's index. `extraDeps` are added to the derived ones.
  uint32_t send(int peer, uint16_t channel, Slice src, uint64_t bytes,
                const std::vector<uint32_t>& extraDeps = {});
  uint32_t recv(int peer, uint16_t channel, Slice dst, uint64_t bytes,
                const std::vector<uint32_t>& extraDeps = {});
  // dst = local (times the scalar with kScaleSrc) + partial.
  uint32_t reduce(Slice dst, Slice local, Slice partial, uint64_t bytes, uint8_t flags = 0);
  uint32_t copy(Slice dst, Slice src, uint64_t bytes, uint8_t flags = 0,
                const std::vector<uint32_t>& extraDeps = {});
  uint32_t divide(Slice dst, Slice src, uint64_t bytes);

  // The local contribution alone becomes the result: dst = src (times the scalar
  // for kPreMulSum, divided for an integer average). nranks == 1 and the like.
  void finishLocal(Slice dst, Slice src, uint64_t bytes, const ReduceSpec& spec);

  // Scratch: builders reserve areas in order. scratchEnd() is where the next
  // area starts (64-byte aligned); reserveScratch returns that offset.
  uint64_t scratchEnd() const { return alignUp(plan_.scratchBytes, 64); }
  uint64_t reserveScratch(uint64_t bytes);

  // Finalizes lanes and returns the plan.
  Plan finish();

 private:
  struct Access {
    int region;
    int64_t begin, end;
    bool write;
  };
  struct Record {
    int64_t end;
    uint32_t step;
    bool write;
  };
  // Accesses that later steps may conflict with, keyed by first byte.
  struct Region {
    std::multimap<int64_t, Record> records;
    int64_t maxLen = 0;
  };
  Access access(Slice s, uint64_t bytes, bool write) const;
  uint32_t emit(Step step, std::initializer_list<Access> accesses,
                const std::vector<uint32_t>& extraDeps);

  Plan plan_;
  OpLayout layout_;
  Region regions_[3];  // user memory (recv and aliased send), unaliased send, scratch
};

// Fixed-size scratch slots, reused in time order (see top of file).
class SlotPool {
 public:
  SlotPool(uint64_t base, uint64_t slotBytes, int64_t reuseDistance = 2)
      : base_(base), slotBytes_(alignUp(slotBytes == 0 ? 1 : slotBytes, 64)),
        reuseDistance_(reuseDistance) {}
  // A slot free at time `now`; grows the pool when none is.
  int acquire(int64_t now);
  // The slot's last reader runs at time `now`.
  void release(int slot, int64_t now) { releasedAt_[slot] = now; }
  Slice slice(int slot) const { return scratchAt(base_ + slot * slotBytes_); }
  uint64_t bytesUsed() const { return releasedAt_.size() * slotBytes_; }

 private:
  uint64_t base_, slotBytes_;
  int64_t reuseDistance_;
  std::vector<int64_t> releasedAt_;  // INT64_MAX while held
};

// The non-empty near-equal parts of `count` elements, one per channel, as
// (channel index, elements). At most params.channels parts.
struct ChannelPart {
  uint16_t channel;
  patterns::ElemRange elems;
};
std::vector<ChannelPart> channelParts(uint64_t count, const AlgoParams& params,
                                      uint64_t granule);

// Maximum segment in elements for a params.segmentBytes (at least one granule).
uint64_t segmentElems(const AlgoParams& params, uint64_t elemSize, uint64_t granule);

}  // namespace shoal::build
