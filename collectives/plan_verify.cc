#include "collectives/plan_verify.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <deque>
#include <map>
#include <random>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "collectives/layout.h"
#include "reduce/numerics.h"

namespace shoal {

namespace {

// ---------------------------------------------------------------- helpers ---

constexpr size_t kMaxVerifiedSteps = 32768;  // reachability bitsets: steps^2 / 8 bytes

std::string stepLine(const Plan& plan, uint32_t i) {
  const Step& s = plan.steps[i];
  std::string line = str("step ", i, " (", stepKindName(s.kind));
  if (s.kind == StepKind::kSend) line += str(" to ", s.peer, " ch ", s.channel);
  if (s.kind == StepKind::kRecv) line += str(" from ", s.peer, " ch ", s.channel);
  if (s.op) line += str(" op ", s.op);
  return line + str(", ", s.bytes, " bytes)");
}

Status planError(const Plan& plan, uint32_t i, const std::string& what) {
  return internalError("plan ", plan.algorithm, " rank ", plan.rank, " ", stepLine(plan, i),
                       ": ", what);
}

bool isP2p(CollKind k) { return k == CollKind::kSend || k == CollKind::kRecv; }

// The slices a step reads and writes.
struct SliceUse {
  Slice slice;
  bool write;
};
int sliceUses(const Step& s, SliceUse out[3]) {
  switch (s.kind) {
    case StepKind::kSend: out[0] = {s.src, false}; return 1;
    case StepKind::kRecv: out[0] = {s.dst, true}; return 1;
    case StepKind::kReduce:
      out[0] = {s.src, false};
      out[1] = {s.src2, false};
      out[2] = {s.dst, true};
      return 3;
    case StepKind::kCopy:
    case StepKind::kDivide:
      out[0] = {s.src, false};
      out[1] = {s.dst, true};
      return 2;
  }
  return 0;
}

// Per-op facts of one rank's plan.
struct OpInfo {
  OpLayout layout;
  uint64_t elemSize = 1;
  uint64_t scratchBegin = 0;
  uint64_t scratchSize = 0;
};

std::vector<OpInfo> opInfos(const Plan& plan) {
  std::vector<OpInfo> ops(plan.shapes.size());
  for (size_t k = 0; k < ops.size(); ++k) {
    ops[k].layout = opLayout(plan.shapes[k], plan.rank, plan.nranks);
    ops[k].elemSize = dataTypeSize(plan.shapes[k].dtype);
    ops[k].scratchBegin = k < plan.scratchOffsets.size() ? plan.scratchOffsets[k] : 0;
    uint64_t end = plan.scratchBytes;
    for (uint64_t off : plan.scratchOffsets) {
      if (off > ops[k].scratchBegin && off < end) end = off;
    }
    ops[k].scratchSize = end >= ops[k].scratchBegin ? end - ops[k].scratchBegin : 0;
  }
  return ops;
}

uint64_t bufferSize(const OpInfo& op, BufferId b) {
  switch (b % kBuffersPerOp) {
    case kSendBuffer: return op.layout.sendBytes;
    case kRecvBuffer: return op.layout.recvBytes;
    default: return op.scratchSize;
  }
}

const char* bufferName(BufferId b) {
  static const char* const kNames[kBuffersPerOp] = {"send", "recv", "scratch"};
  return kNames[b % kBuffersPerOp];
}

// A byte range in an address space where aliasing buffers share addresses.
struct Span {
  int64_t region;  // 2k: op k's recv (and aliased send); 2k+1: op k's send; -1: scratch
  int64_t begin, end;
  bool write;
};

// Window and peer buffers (peer-reading plans) are other address spaces here:
// a region of their own each, below every local one. Ordering against peers'
// accesses is the barriers' job, which the simulator and the tests exercise.
bool isEngineBuffer(BufferId b) { return b == kWindowBuffer || isPeerBuffer(b); }

Span spanOf(const std::vector<OpInfo>& ops, Slice s, uint64_t bytes, bool write, bool inPlace) {
  if (isEngineBuffer(s.buffer)) {
    int64_t off = static_cast<int64_t>(s.offset);
    return {-2 - static_cast<int64_t>(s.buffer), off, off + static_cast<int64_t>(bytes), write};
  }
  const int64_t k = s.buffer / kBuffersPerOp;
  const OpInfo& op = ops[k];
  int64_t off = static_cast<int64_t>(s.offset), len = static_cast<int64_t>(bytes);
  switch (s.buffer % kBuffersPerOp) {
    case kSendBuffer:
      if (inPlace && op.layout.mayAlias) {
        off += op.layout.inPlaceDelta;
        return {2 * k, off, off + len, write};
      }
      return {2 * k + 1, off, off + len, write};
    case kRecvBuffer: return {2 * k, off, off + len, write};
    default:
      off += static_cast<int64_t>(op.scratchBegin);
      return {-1, off, off + len, write};
  }
}

std::string regionName(int64_t region) {
  if (region < -1) return region == -2 - static_cast<int64_t>(kWindowBuffer) ? "window" : "peer buffer";
  if (region < 0) return "scratch";
  return str(region % 2 ? "send" : "recv", region >= 2 ? str(" of op ", region / 2) : "");
}

// ---------------------------------------------------- one-rank checks ---

Status checkStructure(const Plan& plan) {
  if (plan.nranks < 1 || plan.rank < 0 || plan.rank >= plan.nranks)
    return internalError("plan ", plan.algorithm, ": rank ", plan.rank, " of ", plan.nranks);
  if (plan.shapes.empty()) return internalError("plan ", plan.algorithm, ": no shapes");
  if (plan.scratchOffsets.size() != plan.shapes.size())
    return internalError("plan ", plan.algorithm, ": ", plan.scratchOffsets.size(),
                         " scratch offsets for ", plan.shapes.size(), " ops");
  for (uint64_t off : plan.scratchOffsets) {
    if (off > plan.scratchBytes)
      return internalError("plan ", plan.algorithm, ": scratch offset ", off, " beyond ",
                           plan.scratchBytes);
  }
  std::map<std::tuple<int32_t, uint16_t, bool>, int32_t> laneOf;
  std::vector<Lane> lanes;
  for (uint32_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    if (s.op >= plan.shapes.size()) return planError(plan, i, "op out of range");
    if (static_cast<uint64_t>(s.depBegin) + s.depCount > plan.deps.size())
      return planError(plan, i, "dependencies out of range");
    for (uint32_t d = 0; d < s.depCount; ++d) {
      if (plan.deps[s.depBegin + d] >= i)
        return planError(plan, i, str("depends on step ", plan.deps[s.depBegin + d],
                                      ", not an earlier one (cycle or unsorted steps)"));
    }
    int32_t lane = -1;
    uint32_t seq = 0;
    if (s.kind == StepKind::kSend || s.kind == StepKind::kRecv) {
      bool isSend = s.kind == StepKind::kSend;
      auto [it, inserted] =
          laneOf.try_emplace({s.peer, s.channel, isSend}, static_cast<int32_t>(lanes.size()));
      if (inserted) lanes.push_back(Lane{s.peer, s.channel, isSend, {}});
      lane = it->second;
      seq = static_cast<uint32_t>(lanes[lane].steps.size());
      lanes[lane].steps.push_back(i);
    }
    if (s.lane != lane || s.laneSeq != seq)
      return planError(plan, i, str("lane ", s.lane, "#", s.laneSeq, ", expected ", lane, "#",
                                    seq, " (finalizePlan not run?)"));
  }
  if (lanes.size() != plan.lanes.size())
    return internalError("plan ", plan.algorithm, ": ", plan.lanes.size(), " lanes, expected ",
                         lanes.size());
  for (size_t l = 0; l < lanes.size(); ++l) {
    const Lane &a = lanes[l], &b = plan.lanes[l];
    if (a.peer != b.peer || a.channel != b.channel || a.isSend != b.isSend || a.steps != b.steps)
      return internalError("plan ", plan.algorithm, ": lane ", l, " does not match its steps");
  }
  return Status::ok();
}

Status checkSteps(const Plan& plan, const std::vector<OpInfo>& ops) {
  for (uint32_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    const CollShape& shape = plan.shapes[s.op];
    const OpInfo& op = ops[s.op];
    if (s.bytes % op.elemSize)
      return planError(plan, i, str("bytes not a multiple of ", op.elemSize));
    SliceUse uses[3];
    int n = sliceUses(s, uses);
    for (int u = 0; u < n; ++u) {
      const Slice sl = uses[u].slice;
      if (isEngineBuffer(sl.buffer)) {
        if (!plan.readsPeers || s.op != plan.peerReadOp)
          return planError(plan, i, "names a window or peer buffer outside the plan's peer-reading operation");
        if (sl.buffer == kWindowBuffer) {
          const uint64_t size = kWindowSlotBytes * (1 + static_cast<uint64_t>(plan.nranks));
          if (sl.offset > size || s.bytes > size - sl.offset)
            return planError(plan, i, str("window +", sl.offset, " length ", s.bytes, " outside the window"));
          continue;
        }
        const int q = peerOfBuffer(sl.buffer);
        if (q < 0 || q >= plan.nranks || q == plan.rank)
          return planError(plan, i, str("peer buffer of rank ", q));
        if (uses[u].write) return planError(plan, i, "writes a peer's buffer");
        const uint64_t size = bufferSize(op, localKindOfPeerBuffer(sl.buffer));
        if (sl.offset > size || s.bytes > size - sl.offset)
          return planError(plan, i, str("peer ", bufferName(localKindOfPeerBuffer(sl.buffer)), "+", sl.offset,
                                        " length ", s.bytes, " outside the ", size, "-byte buffer"));
        continue;
      }
      if (sl.buffer / kBuffersPerOp != s.op)
        return planError(plan, i, str("slice buffer ", sl.buffer, " is not one of op ", s.op));
      if (sl.offset % op.elemSize)
        return planError(plan, i, str(bufferName(sl.buffer), " offset ", sl.offset,
                                      " not a multiple of ", op.elemSize));
      const uint64_t size = bufferSize(op, sl.buffer);
      if (sl.offset > size || s.bytes > size - sl.offset)
        return planError(plan, i, str(bufferName(sl.buffer), "+", sl.offset, " length ", s.bytes,
                                      " outside the ", size, "-byte buffer"));
      if (uses[u].write && sl.buffer % kBuffersPerOp == kSendBuffer)
        return planError(plan, i, "writes the send buffer");
    }
    if (s.flags & ~kScaleSrc) return planError(plan, i, "unknown flags");
    if ((s.flags & kScaleSrc) &&
        ((s.kind != StepKind::kReduce && s.kind != StepKind::kCopy) ||
         shape.op != ReduceOp::kPreMulSum))
      return planError(plan, i, "kScaleSrc outside a kPreMulSum Reduce/Copy");
    if (s.kind == StepKind::kDivide && shape.divisor == 0)
      return planError(plan, i, "Divide in an op without a divisor");

    if (s.kind == StepKind::kSend || s.kind == StepKind::kRecv) {
      if (s.peer < 0 || s.peer >= plan.nranks) return planError(plan, i, "peer out of range");
      const bool p2p = isP2p(shape.kind);
      if (p2p != (s.channel == kP2pChannel))
        return planError(plan, i, p2p ? "p2p op off kP2pChannel" : "collective on kP2pChannel");
      if (p2p) {
        const StepKind expected = shape.kind == CollKind::kSend ? StepKind::kSend : StepKind::kRecv;
        if (s.kind != expected || s.peer != shape.peer)
          return planError(plan, i, str("does not match the ", collKindName(shape.kind),
                                        " op with peer ", shape.peer));
      } else if (s.peer == plan.rank) {
        return planError(plan, i, "sends to or receives from itself in a collective");
      }
    }

    // Inside a step, dst equals or is disjoint from each source (in place too).
    if (s.kind != StepKind::kSend && s.kind != StepKind::kRecv && s.bytes > 0) {
      const Span dst = spanOf(ops, s.dst, s.bytes, true, true);
      const int sources = s.kind == StepKind::kReduce ? 2 : 1;
      const Slice srcs[2] = {s.src, s.src2};
      for (int k = 0; k < sources; ++k) {
        const Span in = spanOf(ops, srcs[k], s.bytes, false, true);
        if (in.region == dst.region && in.begin < dst.end && dst.begin < in.end &&
            in.begin != dst.begin)
          return planError(plan, i, "dst partially overlaps a source");
      }
    }
  }
  return Status::ok();
}

// Reachability: bit a of row i is set when step a is an ancestor of step i.
class Ancestors {
 public:
  explicit Ancestors(const Plan& plan)
      : n_(plan.steps.size()), words_((n_ + 63) / 64), bits_(n_ * words_, 0) {
    for (size_t i = 0; i < n_; ++i) {
      const Step& s = plan.steps[i];
      uint64_t* row = &bits_[i * words_];
      for (uint32_t d = 0; d < s.depCount; ++d) {
        uint32_t dep = plan.deps[s.depBegin + d];
        const uint64_t* from = &bits_[dep * words_];
        for (size_t w = 0; w <= dep / 64; ++w) row[w] |= from[w];
        row[dep / 64] |= uint64_t{1} << (dep % 64);
      }
    }
  }
  bool reaches(uint32_t a, uint32_t i) const {
    return (bits_[i * words_ + a / 64] >> (a % 64)) & 1;
  }

 private:
  size_t n_, words_;
  std::vector<uint64_t> bits_;
};

Status checkRaces(const Plan& plan, const std::vector<OpInfo>& ops, const VerifyOptions& opt) {
  if (plan.steps.size() > kMaxVerifiedSteps)
    return error(Code::kUnsupported, "plan ", plan.algorithm, " has ", plan.steps.size(),
                 " steps; the verifier handles at most ", kMaxVerifiedSteps);
  const Ancestors anc(plan);
  // Accesses still relevant, per region, keyed by first byte. A write forgets the
  // accesses it covers: they are its ancestors (checked), so anything that
  // conflicts with them conflicts with the write, which is checked instead.
  struct Record {
    int64_t end;
    uint32_t step;
    bool write;
  };
  struct Region {
    std::multimap<int64_t, Record> records;
    int64_t maxLen = 0;
  };
  std::map<int64_t, Region> regions;
  for (uint32_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    SliceUse uses[3];
    Span spans[3];
    const int n = sliceUses(s, uses);
    for (int u = 0; u < n; ++u) {
      spans[u] = spanOf(ops, uses[u].slice, s.bytes, uses[u].write, opt.inPlace);
      const Span& a = spans[u];
      if (a.begin == a.end) continue;
      Region& region = regions[a.region];
      for (auto it = region.records.lower_bound(a.begin - region.maxLen + 1);
           it != region.records.end() && it->first < a.end; ++it) {
        const Record& r = it->second;
        if (r.end <= a.begin || !(a.write || r.write) || anc.reaches(r.step, i)) continue;
        return planError(plan, i,
                         str(a.write ? "writes " : "reads ", regionName(a.region), " bytes [",
                             std::max(a.begin, it->first), ", ", std::min(a.end, r.end),
                             ") that ", stepLine(plan, r.step), r.write ? " writes" : " reads",
                             " concurrently (no dependency path)"));
      }
    }
    for (int u = 0; u < n; ++u) {
      const Span& a = spans[u];
      if (a.begin == a.end) continue;
      Region& region = regions[a.region];
      if (a.write) {
        for (auto it = region.records.lower_bound(a.begin);
             it != region.records.end() && it->first < a.end;) {
          it = it->second.end <= a.end ? region.records.erase(it) : std::next(it);
        }
      }
      region.records.emplace(a.begin, Record{a.end, i, a.write});
      region.maxLen = std::max(region.maxLen, a.end - a.begin);
    }
  }
  return Status::ok();
}

Status checkOutput(const Plan& plan, const std::vector<OpInfo>& ops) {
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> written(ops.size());
  for (const Step& s : plan.steps) {
    SliceUse uses[3];
    const int n = sliceUses(s, uses);
    for (int u = 0; u < n; ++u) {
      if (uses[u].write && !isEngineBuffer(uses[u].slice.buffer) &&
          uses[u].slice.buffer % kBuffersPerOp == kRecvBuffer)
        written[s.op].push_back({uses[u].slice.offset, uses[u].slice.offset + s.bytes});
    }
  }
  for (size_t k = 0; k < ops.size(); ++k) {
    auto& w = written[k];
    std::sort(w.begin(), w.end());
    uint64_t covered = ops[k].layout.outputBegin;
    for (const auto& [b, e] : w) {
      if (b > covered) break;
      covered = std::max(covered, e);
    }
    if (covered < ops[k].layout.outputEnd)
      return internalError("plan ", plan.algorithm, " rank ", plan.rank, " op ", k, " (",
                           collKindName(plan.shapes[k].kind), "): recv bytes [", covered, ", ",
                           ops[k].layout.outputEnd, ") are never written");
  }
  return Status::ok();
}

// ------------------------------------------------------ cross-rank checks ---

struct LanePartner {
  int rank = -1;
  int lane = -1;
};

uint64_t laneKey(int32_t peer, uint16_t channel, bool isSend) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(peer)) << 17) |
         (static_cast<uint64_t>(channel) << 1) | (isSend ? 1 : 0);
}

Result<std::vector<std::vector<LanePartner>>> matchLanes(const std::vector<PlanPtr>& plans) {
  const int n = static_cast<int>(plans.size());
  std::vector<std::unordered_map<uint64_t, int>> index(n);
  for (int r = 0; r < n; ++r) {
    for (size_t l = 0; l < plans[r]->lanes.size(); ++l) {
      const Lane& lane = plans[r]->lanes[l];
      index[r][laneKey(lane.peer, lane.channel, lane.isSend)] = static_cast<int>(l);
    }
  }
  std::vector<std::vector<LanePartner>> partners(n);
  for (int r = 0; r < n; ++r) {
    const Plan& plan = *plans[r];
    partners[r].resize(plan.lanes.size());
    for (size_t l = 0; l < plan.lanes.size(); ++l) {
      const Lane& lane = plan.lanes[l];
      const char* dir = lane.isSend ? "sends" : "receives";
      auto it = index[lane.peer].find(laneKey(r, lane.channel, !lane.isSend));
      if (it == index[lane.peer].end())
        return internalError("rank ", r, " ", dir, " ", lane.steps.size(), " message(s) ",
                             lane.isSend ? "to" : "from", " rank ", lane.peer, " on channel ",
                             lane.channel, "; rank ", lane.peer, " has no matching lane");
      const Plan& other = *plans[lane.peer];
      const Lane& match = other.lanes[it->second];
      if (match.steps.size() != lane.steps.size())
        return internalError("rank ", r, " ", dir, " ", lane.steps.size(), " message(s) ",
                             lane.isSend ? "to" : "from", " rank ", lane.peer, " on channel ",
                             lane.channel, "; rank ", lane.peer, " has ", match.steps.size());
      for (size_t k = 0; k < lane.steps.size(); ++k) {
        uint64_t mine = plan.steps[lane.steps[k]].bytes;
        uint64_t theirs = other.steps[match.steps[k]].bytes;
        if (mine != theirs)
          return internalError("rank ", r, " ", stepLine(plan, lane.steps[k]), ": message ", k,
                               " of the lane has ", mine, " bytes; rank ", lane.peer, " ",
                               stepLine(other, match.steps[k]), " has ", theirs);
      }
      partners[r][l] = LanePartner{lane.peer, it->second};
    }
  }
  return partners;
}

// Runs all plans with rendezvous messages; an unfinished step means deadlock.
Status checkProgress(const std::vector<PlanPtr>& plans,
                     const std::vector<std::vector<LanePartner>>& partners) {
  const int n = static_cast<int>(plans.size());
  enum : uint8_t { kWaiting, kReady, kPosted, kDone };
  std::vector<std::vector<uint8_t>> state(n);
  std::vector<std::vector<uint32_t>> pending(n), lanePosted(n);
  std::vector<std::vector<uint32_t>> childBegin(n), children(n);
  std::vector<std::pair<int, uint32_t>> work;
  size_t total = 0, done = 0;
  for (int r = 0; r < n; ++r) {
    const Plan& plan = *plans[r];
    const size_t steps = plan.steps.size();
    total += steps;
    state[r].assign(steps, kWaiting);
    pending[r].resize(steps);
    lanePosted[r].assign(plan.lanes.size(), 0);
    childBegin[r].assign(steps + 1, 0);
    for (const Step& s : plan.steps)
      for (uint32_t d = 0; d < s.depCount; ++d) ++childBegin[r][plan.deps[s.depBegin + d] + 1];
    for (size_t i = 0; i < steps; ++i) childBegin[r][i + 1] += childBegin[r][i];
    children[r].resize(childBegin[r][steps]);
    std::vector<uint32_t> fill(childBegin[r].begin(), childBegin[r].end() - 1);
    for (uint32_t i = 0; i < steps; ++i) {
      const Step& s = plan.steps[i];
      pending[r][i] = s.depCount;
      for (uint32_t d = 0; d < s.depCount; ++d) children[r][fill[plan.deps[s.depBegin + d]]++] = i;
      if (s.depCount == 0) work.push_back({r, i});
    }
  }
  auto complete = [&](int r, uint32_t i) {
    state[r][i] = kDone;
    ++done;
    for (uint32_t c = childBegin[r][i]; c < childBegin[r][i + 1]; ++c) {
      uint32_t child = children[r][c];
      if (--pending[r][child] == 0) work.push_back({r, child});
    }
  };
  // Posts a ready Send/Recv if it is its lane's next, then any ready successors.
  auto post = [&](int r, uint32_t i) {
    const Plan& plan = *plans[r];
    int lane = plan.steps[i].lane;
    const Lane& l = plan.lanes[lane];
    while (lanePosted[r][lane] < l.steps.size()) {
      uint32_t seq = lanePosted[r][lane];
      uint32_t step = l.steps[seq];
      if (state[r][step] != kReady) break;
      state[r][step] = kPosted;
      ++lanePosted[r][lane];
      const LanePartner& pt = partners[r][lane];
      uint32_t other = plans[pt.rank]->lanes[pt.lane].steps[seq];
      if (state[pt.rank][other] == kPosted) {
        complete(r, step);
        complete(pt.rank, other);
      }
    }
  };
  while (!work.empty()) {
    auto [r, i] = work.back();
    work.pop_back();
    const Step& s = plans[r]->steps[i];
    if (s.kind == StepKind::kSend || s.kind == StepKind::kRecv) {
      state[r][i] = kReady;
      post(r, i);
    } else {
      complete(r, i);
    }
  }
  if (done == total) return Status::ok();
  std::string stuck;
  int shown = 0;
  for (int r = 0; r < n && shown < 4; ++r) {
    for (uint32_t i = 0; i < state[r].size(); ++i) {
      if (state[r][i] == kDone) continue;
      const char* why = state[r][i] == kWaiting ? "waits for dependencies"
                        : state[r][i] == kReady ? "waits for earlier lane steps"
                                                : "posted, peer never matches";
      stuck += str("; rank ", r, " ", stepLine(*plans[r], i), " ", why);
      ++shown;
      break;
    }
  }
  return internalError("plans deadlock: ", total - done, " of ", total,
                       " steps never complete", stuck);
}

}  // namespace

Status verifyPlan(const Plan& plan, const VerifyOptions& options) {
  SHOAL_TRY(checkStructure(plan));
  const std::vector<OpInfo> ops = opInfos(plan);
  SHOAL_TRY(checkSteps(plan, ops));
  SHOAL_TRY(checkRaces(plan, ops, options));
  SHOAL_TRY(checkOutput(plan, ops));
  return Status::ok();
}

Status verifyPlans(const std::vector<PlanPtr>& plansByRank) {
  return verifyPlans(plansByRank, VerifyOptions{});
}

Status verifyPlans(const std::vector<PlanPtr>& plans, const VerifyOptions& options) {
  const int n = static_cast<int>(plans.size());
  if (n == 0) return internalError("no plans to verify");
  for (int r = 0; r < n; ++r) {
    if (!plans[r]) return internalError("rank ", r, " has no plan");
    if (plans[r]->rank != r || plans[r]->nranks != n)
      return internalError("plan at index ", r, " is for rank ", plans[r]->rank, " of ",
                           plans[r]->nranks, " (", n, " plans)");
    SHOAL_TRY(verifyPlan(*plans[r], options));
  }
  SHOAL_ASSIGN_OR_RETURN(auto partners, matchLanes(plans));
  if (options.checkProgress) {
    SHOAL_TRY(checkProgress(plans, partners));
  }
  return Status::ok();
}

// --------------------------------------------------------------- simulator ---

namespace {

template <typename T>
struct Native {
  using Value = T;
  static T load(const void* p, size_t i) {
    T v;
    std::memcpy(&v, static_cast<const char*>(p) + i * sizeof(T), sizeof(T));
    return v;
  }
  static void store(void* p, size_t i, T v) {
    std::memcpy(static_cast<char*>(p) + i * sizeof(T), &v, sizeof(T));
  }
  static T round(T v) { return v; }
};

template <uint16_t (*Enc)(float), float (*Dec)(uint16_t)>
struct Packed16 {
  using Value = float;
  static float load(const void* p, size_t i) {
    uint16_t v;
    std::memcpy(&v, static_cast<const char*>(p) + 2 * i, 2);
    return Dec(v);
  }
  static void store(void* p, size_t i, float v) {
    uint16_t e = Enc(v);
    std::memcpy(static_cast<char*>(p) + 2 * i, &e, 2);
  }
  static float round(float v) { return Dec(Enc(v)); }
};
// The reducer's own conversions (round to nearest even, src/reduce/numerics.h).
using Half = Packed16<reduce::floatToHalf, reduce::halfToFloat>;
using Bf16 = Packed16<reduce::floatToBf16, reduce::bf16ToFloat>;

// Integer arithmetic wraps: compute sums and products in the unsigned type.
template <typename V>
V add(V a, V b) {
  if constexpr (std::is_integral_v<V>) {
    using U = std::make_unsigned_t<V>;
    return static_cast<V>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <typename V>
V mul(V a, V b) {
  if constexpr (std::is_integral_v<V>) {
    using U = std::make_unsigned_t<V>;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<V>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b)));
  } else {
    return a * b;
  }
}

template <typename A>
void combineT(ReduceOp op, void* dst, const void* a, const void* b, size_t count,
              const void* scalar) {
  using V = typename A::Value;
  const V s = scalar ? A::load(scalar, 0) : V{};
  for (size_t i = 0; i < count; ++i) {
    V x = A::load(a, i), y = A::load(b, i), r{};
    switch (op) {
      case ReduceOp::kSum: r = add(x, y); break;
      case ReduceOp::kProd: r = mul(x, y); break;
      case ReduceOp::kMax: r = x < y ? y : x; break;
      case ReduceOp::kMin: r = y < x ? y : x; break;
      case ReduceOp::kPreMulSum: r = add(A::round(mul(x, s)), y); break;
    }
    A::store(dst, i, r);
  }
}

template <typename A>
void scaleT(void* dst, const void* src, size_t count, const void* scalar) {
  const auto s = A::load(scalar, 0);
  for (size_t i = 0; i < count; ++i) A::store(dst, i, mul(A::load(src, i), s));
}

template <typename A>
void divideT(void* dst, const void* src, size_t count, uint64_t divisor) {
  using V = typename A::Value;
  for (size_t i = 0; i < count; ++i) {
    V v = A::load(src, i);
    if constexpr (std::is_integral_v<V> && std::is_signed_v<V>) {
      A::store(dst, i, static_cast<V>(static_cast<int64_t>(v) / static_cast<int64_t>(divisor)));
    } else {
      A::store(dst, i, static_cast<V>(v / static_cast<V>(divisor)));
    }
  }
}

template <template <typename> class F, typename... Args>
void dispatch(DataType t, Args... args) {
  switch (t) {
    case DataType::kInt8: return F<Native<int8_t>>::run(args...);
    case DataType::kUint8: return F<Native<uint8_t>>::run(args...);
    case DataType::kInt32: return F<Native<int32_t>>::run(args...);
    case DataType::kUint32: return F<Native<uint32_t>>::run(args...);
    case DataType::kInt64: return F<Native<int64_t>>::run(args...);
    case DataType::kUint64: return F<Native<uint64_t>>::run(args...);
    case DataType::kFloat16: return F<Half>::run(args...);
    case DataType::kFloat32: return F<Native<float>>::run(args...);
    case DataType::kFloat64: return F<Native<double>>::run(args...);
    case DataType::kBfloat16: return F<Bf16>::run(args...);
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2: break;
  }
  SHOAL_CHECK(false, "fallback reducer: no arithmetic for ", dataTypeName(t));
}

template <typename A>
struct CombineF {
  static void run(ReduceOp op, void* d, const void* a, const void* b, size_t n, const void* s) {
    combineT<A>(op, d, a, b, n, s);
  }
};
template <typename A>
struct ScaleF {
  static void run(void* d, const void* s, size_t n, const void* sc) { scaleT<A>(d, s, n, sc); }
};
template <typename A>
struct DivideF {
  static void run(void* d, const void* s, size_t n, uint64_t div) { divideT<A>(d, s, n, div); }
};

void fallbackCombine(ReduceOp op, DataType t, void* dst, const void* a, const void* b,
                     size_t count, const void* scalar) {
  dispatch<CombineF>(t, op, dst, a, b, count, scalar);
}
void fallbackScale(DataType t, void* dst, const void* src, size_t count, const void* scalar) {
  dispatch<ScaleF>(t, dst, src, count, scalar);
}
void fallbackDivide(DataType t, void* dst, const void* src, size_t count, uint64_t divisor) {
  dispatch<DivideF>(t, dst, src, count, divisor);
}

}  // namespace

const SimReducer& fallbackReducer() {
  static const SimReducer kReducer{fallbackCombine, fallbackScale, fallbackDivide};
  return kReducer;
}

Status simulatePlans(const std::vector<PlanPtr>& plans,
                     const std::vector<std::vector<SimOpBuffers>>& buffers,
                     const SimOptions& options) {
  const SimReducer& red = options.reducer ? *options.reducer : fallbackReducer();
  const int n = static_cast<int>(plans.size());
  if (static_cast<int>(buffers.size()) != n)
    return internalError("simulate: ", buffers.size(), " buffer sets for ", n, " plans");
  struct RankState {
    const Plan* plan;
    std::vector<OpInfo> ops;
    std::vector<uint8_t> scratch;
    std::vector<uint8_t> window;
    std::vector<uint32_t> pending, laneNext;
    std::vector<std::vector<uint32_t>> children;
  };
  std::vector<RankState> ranks(n);
  std::vector<std::pair<int, uint32_t>> ready;
  size_t total = 0, done = 0;
  for (int r = 0; r < n; ++r) {
    RankState& rs = ranks[r];
    rs.plan = plans[r].get();
    if (!rs.plan || rs.plan->rank != r || rs.plan->nranks != n)
      return internalError("simulate: bad plan for rank ", r);
    if (buffers[r].size() < rs.plan->shapes.size())
      return internalError("simulate: rank ", r, " has buffers for ", buffers[r].size(), " of ",
                           rs.plan->shapes.size(), " ops");
    rs.ops = opInfos(*rs.plan);
    for (size_t k = 0; k < rs.ops.size(); ++k) {
      // Buffers that overlap must be in place, and the plan built for that.
      const CollShape& shape = rs.plan->shapes[k];
      const void* send = buffers[r][k].send;
      const void* recv = buffers[r][k].recv;
      if (!buffersMayOverlap(shape, send, recv, r, n)) continue;
      if (shape.disjointBuffers)
        return invalidArgument("simulate: rank ", r, " op ", k,
                               ": the plan was built for disjoint buffers, and they overlap");
      int64_t delta = 0;
      if (!inPlaceOffset(shape, r, delta) ||
          reinterpret_cast<uintptr_t>(send) != reinterpret_cast<uintptr_t>(recv) + static_cast<uint64_t>(delta))
        return invalidArgument("simulate: rank ", r, " op ", k, ": the buffers overlap other than in place");
    }
    rs.scratch.assign(rs.plan->scratchBytes, 0xA5);
    const size_t steps = rs.plan->steps.size();
    total += steps;
    rs.pending.resize(steps);
    rs.children.resize(steps);
    rs.laneNext.assign(rs.plan->lanes.size(), 0);
    for (uint32_t i = 0; i < steps; ++i) {
      const Step& s = rs.plan->steps[i];
      rs.pending[i] = s.depCount;
      for (uint32_t d = 0; d < s.depCount; ++d) rs.children[rs.plan->deps[s.depBegin + d]].push_back(i);
      if (s.depCount == 0) ready.push_back({r, i});
    }
  }
  // FIFO per (sender, receiver, channel).
  std::map<std::tuple<int, int, uint16_t>, std::deque<std::vector<uint8_t>>> fifo;

  auto resolve = [&](int r, const Step& s, Slice sl) -> Result<uint8_t*> {
    RankState& rs = ranks[r];
    if (sl.buffer == kWindowBuffer) {
      rs.window.resize(kWindowSlotBytes * (1 + static_cast<size_t>(n)));
      if (sl.offset + s.bytes > rs.window.size()) return internalError("window access out of range");
      return rs.window.data() + sl.offset;
    }
    if (isPeerBuffer(sl.buffer)) {
      // Ranks of a simulation share one address space: a peer's buffer is its pointer.
      const int q = peerOfBuffer(sl.buffer);
      if (q < 0 || q >= n) return internalError("peer buffer of rank ", q);
      const SimOpBuffers& peer = buffers[q][ranks[q].plan->peerReadOp];
      void* base = localKindOfPeerBuffer(sl.buffer) == kSendBuffer ? peer.send : peer.recv;
      if (!base && s.bytes > 0) return internalError("peer buffer is null");
      return base ? static_cast<uint8_t*>(base) + sl.offset : nullptr;
    }
    const BufferId k = sl.buffer / kBuffersPerOp;
    if (k >= rs.ops.size()) return internalError("buffer ", sl.buffer, " of no op");
    const uint64_t size = bufferSize(rs.ops[k], sl.buffer);
    if (sl.offset > size || s.bytes > size - sl.offset)
      return internalError(bufferName(sl.buffer), "+", sl.offset, " length ", s.bytes,
                           " outside the ", size, "-byte buffer");
    uint8_t* base = nullptr;
    switch (sl.buffer % kBuffersPerOp) {
      case kSendBuffer: base = static_cast<uint8_t*>(buffers[r][k].send); break;
      case kRecvBuffer: base = static_cast<uint8_t*>(buffers[r][k].recv); break;
      default: base = rs.scratch.data() + rs.ops[k].scratchBegin; break;
    }
    if (!base && s.bytes > 0) return internalError(bufferName(sl.buffer), " buffer is null");
    return base ? base + sl.offset : nullptr;
  };

  auto execute = [&](int r, uint32_t i) -> Status {
    RankState& rs = ranks[r];
    const Step& s = rs.plan->steps[i];
    const CollShape& shape = rs.plan->shapes[s.op];
    const size_t count = s.bytes / dataTypeSize(shape.dtype);
    const void* scalar = buffers[r][s.op].scalar;
    switch (s.kind) {
      case StepKind::kSend: {
        SHOAL_ASSIGN_OR_RETURN(uint8_t* src, resolve(r, s, s.src));
        fifo[{r, s.peer, s.channel}].emplace_back(src, src + s.bytes);
        break;
      }
      case StepKind::kRecv: {
        SHOAL_ASSIGN_OR_RETURN(uint8_t* dst, resolve(r, s, s.dst));
        auto& q = fifo[{s.peer, r, s.channel}];
        if (q.front().size() != s.bytes)
          return internalError("received ", q.front().size(), " bytes, expected ", s.bytes);
        if (s.bytes) std::memcpy(dst, q.front().data(), s.bytes);
        q.pop_front();
        break;
      }
      case StepKind::kReduce: {
        SHOAL_ASSIGN_OR_RETURN(uint8_t* dst, resolve(r, s, s.dst));
        SHOAL_ASSIGN_OR_RETURN(uint8_t* a, resolve(r, s, s.src));
        SHOAL_ASSIGN_OR_RETURN(uint8_t* b, resolve(r, s, s.src2));
        ReduceOp op = shape.op;
        if (op == ReduceOp::kPreMulSum && !(s.flags & kScaleSrc)) op = ReduceOp::kSum;
        if (op == ReduceOp::kPreMulSum && !scalar) return internalError("no scalar");
        if (count) red.combine(op, shape.dtype, dst, a, b, count, scalar);
        break;
      }
      case StepKind::kCopy: {
        SHOAL_ASSIGN_OR_RETURN(uint8_t* dst, resolve(r, s, s.dst));
        SHOAL_ASSIGN_OR_RETURN(uint8_t* src, resolve(r, s, s.src));
        if ((s.flags & kScaleSrc) && shape.op == ReduceOp::kPreMulSum) {
          if (!scalar) return internalError("no scalar");
          if (count) red.scale(shape.dtype, dst, src, count, scalar);
        } else if (dst != src && s.bytes) {
          std::memmove(dst, src, s.bytes);
        }
        break;
      }
      case StepKind::kDivide: {
        SHOAL_ASSIGN_OR_RETURN(uint8_t* dst, resolve(r, s, s.dst));
        SHOAL_ASSIGN_OR_RETURN(uint8_t* src, resolve(r, s, s.src));
        if (shape.divisor == 0) return internalError("divide by zero");
        if (count) red.divide(shape.dtype, dst, src, count, shape.divisor);
        break;
      }
    }
    return Status::ok();
  };

  // A ready step waits for what it needs before it may run: a Send or Recv
  // its lane's turn, a Recv also a message in its FIFO. Those that have it
  // are `runnable`; the others are parked on what they wait for and looked
  // at again only when it comes (the lane advances, a message arrives), so a
  // plan of n steps runs in O(n log n), whatever the number of ranks.
  using FifoKey = std::tuple<int, int, uint16_t>;
  std::vector<std::pair<int, uint32_t>> runnable;
  std::vector<std::vector<std::vector<int64_t>>> laneParked(n);  // [rank][lane][laneSeq]: step, or -1
  std::map<FifoKey, std::vector<uint32_t>> fifoParked;            // (sender, receiver, channel): steps
  for (int r = 0; r < n; ++r) {
    const Plan& plan = *ranks[r].plan;
    laneParked[r].resize(plan.lanes.size());
    for (const Step& s : plan.steps)
      if (s.lane >= 0 && s.lane < static_cast<int32_t>(plan.lanes.size()) &&
          laneParked[r][s.lane].size() <= s.laneSeq)
        laneParked[r][s.lane].resize(s.laneSeq + 1, -1);
  }
  // Whether the FIFO a receive of rank r reads holds a message.
  auto hasMessage = [&](int r, const Step& s) {
    auto it = fifo.find({s.peer, r, s.channel});
    return it != fifo.end() && !it->second.empty();
  };
  // Puts a ready step where it belongs: runnable, or parked on what it lacks.
  auto place = [&](int r, uint32_t i) {
    RankState& rs = ranks[r];
    const Step& s = rs.plan->steps[i];
    if (s.kind == StepKind::kSend || s.kind == StepKind::kRecv) {
      if (rs.laneNext[s.lane] != s.laneSeq) {
        laneParked[r][s.lane][s.laneSeq] = i;
        return;
      }
      if (s.kind == StepKind::kRecv && !hasMessage(r, s)) {
        fifoParked[{s.peer, r, s.channel}].push_back(i);
        return;
      }
    }
    runnable.push_back({r, i});
  };
  for (auto [r, i] : ready) place(r, i);
  ready.clear();

  std::mt19937_64 rng(options.seed);
  while (!runnable.empty()) {
    const size_t pick = rng() % runnable.size();
    auto [r, i] = runnable[pick];
    runnable[pick] = runnable.back();
    runnable.pop_back();
    RankState& rs = ranks[r];
    const Step& s = rs.plan->steps[i];
    if (s.kind == StepKind::kRecv && !hasMessage(r, s)) {
      place(r, i);  // another receive on this FIFO (another lane) took its message
      continue;
    }
    if (Status st = execute(r, i); !st.isOk())
      return st.withContext(str("simulate rank ", r, " ", stepLine(*rs.plan, i)));
    ++done;
    if (s.lane >= 0) {
      const uint32_t next = ++rs.laneNext[s.lane];
      std::vector<int64_t>& waiting = laneParked[r][s.lane];
      if (next < waiting.size() && waiting[next] >= 0) {
        place(r, static_cast<uint32_t>(std::exchange(waiting[next], -1)));
      }
    }
    if (s.kind == StepKind::kSend) {
      auto it = fifoParked.find({r, s.peer, s.channel});
      if (it != fifoParked.end()) {
        std::vector<uint32_t> woken = std::move(it->second);
        fifoParked.erase(it);
        for (uint32_t w : woken) place(s.peer, w);
      }
    }
    for (uint32_t c : rs.children[i])
      if (--rs.pending[c] == 0) place(r, c);
  }
  if (done != total) {
    std::string stuck;
    int said = 0;
    for (int r = 0; r < n && said < 4; ++r)
      for (const auto& lane : laneParked[r])
        for (int64_t i : lane)
          if (i >= 0 && said < 4) {
            stuck += str("; rank ", r, " ", stepLine(*ranks[r].plan, static_cast<uint32_t>(i)));
            ++said;
          }
    for (const auto& [key, steps] : fifoParked)
      for (uint32_t i : steps)
        if (said < 4) {
          const int r = std::get<1>(key);
          stuck += str("; rank ", r, " ", stepLine(*ranks[r].plan, i));
          ++said;
        }
    return internalError("simulate: deadlock, ", total - done, " of ", total,
                         " steps never ran", stuck);
  }
  for (const auto& [key, q] : fifo) {
    if (!q.empty())
      return internalError("simulate: ", q.size(), " message(s) from rank ", std::get<0>(key),
                           " to rank ", std::get<1>(key), " on channel ", std::get<2>(key),
                           " never received");
  }
  return Status::ok();
}

}  // namespace shoal
