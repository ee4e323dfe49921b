#include "collectives/builder_util.h"

#include <algorithm>
#include <limits>

#include "core/status.h"

namespace shoal::build {

namespace {
constexpr int kUserRegion = 0;      // recv bytes, and send bytes that may alias them
constexpr int kSendRegion = 1;      // send bytes of a collective that is never in place
constexpr int kScratchRegion = 2;
}  // namespace

StepEmitter::StepEmitter(const CollShape& shape, const RankView& view, std::string algorithm) {
  plan_.shapes = {shape};
  plan_.algorithm = std::move(algorithm);
  plan_.rank = view.rank;
  plan_.nranks = view.nranks;
  layout_ = opLayout(shape, view.rank, view.nranks);
}

StepEmitter::Access StepEmitter::access(Slice s, uint64_t bytes, bool write) const {
  int64_t off = static_cast<int64_t>(s.offset);
  int64_t len = static_cast<int64_t>(bytes);
  switch (s.buffer) {
    case kSendBuffer:
      if (layout_.mayAlias) return {kUserRegion, off + layout_.inPlaceDelta,
                                    off + layout_.inPlaceDelta + len, write};
      return {kSendRegion, off, off + len, write};
    case kRecvBuffer: return {kUserRegion, off, off + len, write};
    case kScratchBuffer: return {kScratchRegion, off, off + len, write};
  }
  SHOAL_CHECK(false, "builder slice names buffer ", s.buffer);
  return {};
}

uint32_t StepEmitter::emit(Step step, std::initializer_list<Access> accesses,
                           const std::vector<uint32_t>& extraDeps) {
  const uint32_t id = static_cast<uint32_t>(plan_.steps.size());
  std::vector<uint32_t> deps = extraDeps;
  for (const Access& a : accesses) {
    if (a.begin == a.end) continue;
    const Region& region = regions_[a.region];
    for (auto it = region.records.lower_bound(a.begin - region.maxLen + 1);
         it != region.records.end() && it->first < a.end; ++it) {
      const Record& r = it->second;
      if (r.end > a.begin && (a.write || r.write)) deps.push_back(r.step);
    }
  }
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  for (const Access& a : accesses) {
    if (a.begin == a.end) continue;
    Region& region = regions_[a.region];
    if (a.write) {
      // Earlier accesses inside a written range are ordered before this step, and
      // anything later that touches them also touches this write: forget them.
      for (auto it = region.records.lower_bound(a.begin);
           it != region.records.end() && it->first < a.end;) {
        it = it->second.end <= a.end ? region.records.erase(it) : std::next(it);
      }
    }
    region.records.emplace(a.begin, Record{a.end, id, a.write});
    region.maxLen = std::max(region.maxLen, a.end - a.begin);
  }
  PlanBuilder(plan_).add(step, deps);
  return id;
}

uint32_t StepEmitter::send(int peer, uint16_t channel, Slice src, uint64_t bytes,
                           const std::vector<uint32_t>& extraDeps) {
  return emit(sendStep(peer, channel, src, bytes), {access(src, bytes, false)}, extraDeps);
}

uint32_t StepEmitter::recv(int peer, uint16_t channel, Slice dst, uint64_t bytes,
                           const std::vector<uint32_t>& extraDeps) {
  return emit(recvStep(peer, channel, dst, bytes), {access(dst, bytes, true)}, extraDeps);
}

uint32_t StepEmitter::reduce(Slice dst, Slice local, Slice partial, uint64_t bytes,
                             uint8_t flags) {
  return emit(reduceStep(dst, local, partial, bytes, flags),
              {access(local, bytes, false), access(partial, bytes, false),
               access(dst, bytes, true)},
              {});
}

uint32_t StepEmitter::copy(Slice dst, Slice src, uint64_t bytes, uint8_t flags,
                           const std::vector<uint32_t>& extraDeps) {
  return emit(copyStep(dst, src, bytes, flags),
              {access(src, bytes, false), access(dst, bytes, true)}, extraDeps);
}

uint32_t StepEmitter::divide(Slice dst, Slice src, uint64_t bytes) {
  return emit(divideStep(dst, src, bytes),
              {access(src, bytes, false), access(dst, bytes, true)}, {});
}

void StepEmitter::finishLocal(Slice dst, Slice src, uint64_t bytes, const ReduceSpec& spec) {
  if (spec.divisor > 1) {
    divide(dst, src, bytes);
  } else {
    copy(dst, src, bytes, spec.localFlags());
  }
}

uint64_t StepEmitter::reserveScratch(uint64_t bytes) {
  uint64_t at = scratchEnd();
  if (bytes > 0) plan_.scratchBytes = at + bytes;
  return at;
}

Plan StepEmitter::finish() {
  finalizePlan(plan_);
  return std::move(plan_);
}

int SlotPool::acquire(int64_t now) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(releasedAt_.size()); ++i) {
    int64_t at = releasedAt_[i];
    if (at == std::numeric_limits<int64_t>::max() || at + reuseDistance_ > now) continue;
    if (best < 0 || at < releasedAt_[best]) best = i;
  }
  if (best < 0) {
    best = static_cast<int>(releasedAt_.size());
    releasedAt_.push_back(0);
  }
  releasedAt_[best] = std::numeric_limits<int64_t>::max();
  return best;
}

std::vector<ChannelPart> channelParts(uint64_t count, const AlgoParams& params,
                                      uint64_t granule) {
  const int channels = std::max(1, std::min(params.channels, static_cast<int>(kP2pChannel)));
  std::vector<ChannelPart> parts;
  for (int c = 0; c < channels; ++c) {
    patterns::ElemRange r = patterns::evenPart(count, channels, c, granule);
    if (r.count > 0) parts.push_back(ChannelPart{static_cast<uint16_t>(c), r});
  }
  return parts;
}

uint64_t segmentElems(const AlgoParams& params, uint64_t elemSize, uint64_t granule) {
  uint64_t elems = params.segmentBytes / elemSize;
  return std::max<uint64_t>(granule, elems / granule * granule);
}

}  // namespace shoal::build
