#include "collectives/plan.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "core/status.h"

namespace shoal {

const char* stepKindName(StepKind kind) {
  switch (kind) {
    case StepKind::kSend: return "Send";
    case StepKind::kRecv: return "Recv";
    case StepKind::kReduce: return "Reduce";
    case StepKind::kCopy: return "Copy";
    case StepKind::kDivide: return "Divide";
  }
  return "invalid";
}

namespace {

std::string sliceName(Slice s) {
  if (s.buffer == kWindowBuffer) return str("window+", s.offset);
  if (isPeerBuffer(s.buffer))
    return str("peer", peerOfBuffer(s.buffer), ".", localKindOfPeerBuffer(s.buffer) == kSendBuffer ? "send" : "recv",
               "+", s.offset);
  static const char* const kNames[kBuffersPerOp] = {"send", "recv", "scratch"};
  std::string name = kNames[s.buffer % kBuffersPerOp];
  if (s.buffer >= kBuffersPerOp) name = str("op", s.buffer / kBuffersPerOp, ".", name);
  return str(name, "+", s.offset);
}

}  // namespace

std::string Plan::toString() const {
  std::ostringstream out;
  out << "plan " << algorithm << " rank " << rank << "/" << nranks << " ops " << shapes.size();
  for (size_t k = 0; k < shapes.size(); ++k) {
    const CollShape& s = shapes[k];
    out << (k ? "; " : " [") << collKindName(s.kind) << " " << dataTypeName(s.dtype) << " "
        << reduceOpName(s.op) << " count " << s.count;
    if (s.root >= 0) out << " root " << s.root;
    if (s.peer >= 0) out << " peer " << s.peer;
    if (s.divisor > 1) out << " divisor " << s.divisor;
    if (s.disjointBuffers) out << " disjoint buffers";
    if (k + 1 == shapes.size()) out << "]";
  }
  out << " steps " << steps.size() << " lanes " << lanes.size() << " scratch " << scratchBytes;
  if (readsPeers) out << " reads peers (op " << peerReadOp << ")";
  out << "\n";
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    out << "  " << i << " " << stepKindName(s.kind);
    if (s.op) out << " op " << s.op;
    switch (s.kind) {
      case StepKind::kSend:
        out << " to " << s.peer << " ch " << s.channel << " " << sliceName(s.src);
        break;
      case StepKind::kRecv:
        out << " from " << s.peer << " ch " << s.channel << " " << sliceName(s.dst);
        break;
      case StepKind::kReduce:
        out << " " << sliceName(s.dst) << " = " << sliceName(s.src)
            << ((s.flags & kScaleSrc) ? "*scalar" : "") << " + " << sliceName(s.src2);
        break;
      case StepKind::kCopy:
        out << " " << sliceName(s.dst) << " = " << sliceName(s.src)
            << ((s.flags & kScaleSrc) ? "*scalar" : "");
        break;
      case StepKind::kDivide:
        out << " " << sliceName(s.dst) << " = " << sliceName(s.src) << "/divisor";
        break;
    }
    out << " bytes " << s.bytes << " deps [";
    for (uint32_t d = 0; d < s.depCount; ++d) out << (d ? "," : "") << deps[s.depBegin + d];
    out << "]";
    if (s.lane >= 0) out << " lane " << s.lane << "#" << s.laneSeq;
    out << "\n";
  }
  return out.str();
}

void finalizePlan(Plan& plan) {
  plan.lanes.clear();
  std::map<std::tuple<int32_t, uint16_t, bool>, int32_t> laneOf;
  for (uint32_t i = 0; i < plan.steps.size(); ++i) {
    Step& step = plan.steps[i];
    SHOAL_CHECK(static_cast<uint64_t>(step.depBegin) + step.depCount <= plan.deps.size(),
                "plan ", plan.algorithm, " step ", i, ": dependencies out of range");
    for (uint32_t d = 0; d < step.depCount; ++d) {
      SHOAL_CHECK(plan.deps[step.depBegin + d] < i, "plan ", plan.algorithm, " step ", i,
                  " depends on step ", plan.deps[step.depBegin + d], " (not earlier)");
    }
    step.lane = -1;
    step.laneSeq = 0;
    if (step.kind != StepKind::kSend && step.kind != StepKind::kRecv) continue;
    bool isSend = step.kind == StepKind::kSend;
    auto [it, inserted] = laneOf.try_emplace({step.peer, step.channel, isSend},
                                             static_cast<int32_t>(plan.lanes.size()));
    if (inserted) plan.lanes.push_back(Lane{step.peer, step.channel, isSend, {}});
    Lane& lane = plan.lanes[it->second];
    step.lane = it->second;
    step.laneSeq = static_cast<uint32_t>(lane.steps.size());
    lane.steps.push_back(i);
  }
}

Plan mergePlans(const std::vector<PlanPtr>& plans) {
  SHOAL_CHECK(!plans.empty(), "mergePlans of no plans");
  constexpr uint64_t kScratchAlign = 64;
  Plan merged;
  merged.rank = plans[0]->rank;
  merged.nranks = plans[0]->nranks;
  merged.scratchOffsets.clear();
  uint64_t scratchEnd = 0;
  for (const PlanPtr& p : plans) {
    SHOAL_CHECK(p->rank == merged.rank && p->nranks == merged.nranks,
                "mergePlans: rank ", p->rank, "/", p->nranks, " vs ", merged.rank, "/",
                merged.nranks);
    const OpIndex opBase = static_cast<OpIndex>(merged.shapes.size());
    const uint32_t stepBase = static_cast<uint32_t>(merged.steps.size());
    const uint32_t depBase = static_cast<uint32_t>(merged.deps.size());
    const uint64_t scratchBase = (scratchEnd + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    const size_t nOps = p->shapes.size();
    SHOAL_CHECK(nOps >= 1, "mergePlans: plan without a shape");
    if (p->readsPeers) {
      SHOAL_CHECK(nOps == 1 && !merged.readsPeers, "mergePlans: more than one peer-reading operation");
      merged.readsPeers = true;
      merged.peerReadOp = opBase;
    }
    SHOAL_CHECK(merged.shapes.size() + nOps <= kMaxMergedOps, "mergePlans: more than ", kMaxMergedOps,
                " operations");
    for (size_t k = 0; k < nOps; ++k) {
      merged.shapes.push_back(p->shapes[k]);
      uint64_t off = k < p->scratchOffsets.size() ? p->scratchOffsets[k] : 0;
      merged.scratchOffsets.push_back(scratchBase + off);
    }
    scratchEnd = scratchBase + p->scratchBytes;
    if (!merged.algorithm.empty()) merged.algorithm += "+";
    merged.algorithm += p->algorithm;
    auto remap = [&](Slice s) {
      if (s.buffer != kWindowBuffer && !isPeerBuffer(s.buffer))  // the engine's, not the op's
        s.buffer = s.buffer + kBuffersPerOp * opBase;
      return s;
    };
    for (const Step& s : p->steps) {
      Step t = s;
      t.op = s.op + opBase;
      t.dst = remap(s.dst);
      t.src = remap(s.src);
      t.src2 = remap(s.src2);
      t.depBegin = s.depBegin + depBase;
      merged.steps.push_back(t);
    }
    for (uint32_t d : p->deps) merged.deps.push_back(d + stepBase);
  }
  merged.scratchBytes = scratchEnd;
  finalizePlan(merged);
  return merged;
}

uint32_t PlanBuilder::add(Step step, const std::vector<uint32_t>& deps) {
  step.depBegin = static_cast<uint32_t>(plan_.deps.size());
  step.depCount = static_cast<uint32_t>(deps.size());
  plan_.deps.insert(plan_.deps.end(), deps.begin(), deps.end());
  plan_.steps.push_back(step);
  return static_cast<uint32_t>(plan_.steps.size() - 1);
}

Step sendStep(int peer, uint16_t channel, Slice src, uint64_t bytes) {
  Step s;
  s.kind = StepKind::kSend;
  s.peer = peer;
  s.channel = channel;
  s.src = src;
  s.bytes = bytes;
  return s;
}

Step recvStep(int peer, uint16_t channel, Slice dst, uint64_t bytes) {
  Step s;
  s.kind = StepKind::kRecv;
  s.peer = peer;
  s.channel = channel;
  s.dst = dst;
  s.bytes = bytes;
  return s;
}

Step reduceStep(Slice dst, Slice src, Slice src2, uint64_t bytes, uint8_t flags) {
  Step s;
  s.kind = StepKind::kReduce;
  s.flags = flags;
  s.dst = dst;
  s.src = src;
  s.src2 = src2;
  s.bytes = bytes;
  return s;
}

Step copyStep(Slice dst, Slice src, uint64_t bytes, uint8_t flags) {
  Step s;
  s.kind = StepKind::kCopy;
  s.flags = flags;
  s.dst = dst;
  s.src = src;
  s.bytes = bytes;
  return s;
}

Step divideStep(Slice dst, Slice src, uint64_t bytes) {
  Step s;
  s.kind = StepKind::kDivide;
  s.dst = dst;
  s.src = src;
  s.bytes = bytes;
  return s;
}

uint32_t PlanBuilder::send(int peer, Slice src, uint64_t bytes,
                           std::initializer_list<uint32_t> deps, uint16_t channel) {
  return add(sendStep(peer, channel, src, bytes), std::vector<uint32_t>(deps));
}

uint32_t PlanBuilder::recv(int peer, Slice dst, uint64_t bytes,
                           std::initializer_list<uint32_t> deps, uint16_t channel) {
  return add(recvStep(peer, channel, dst, bytes), std::vector<uint32_t>(deps));
}

uint32_t PlanBuilder::reduce(Slice dst, Slice src, Slice src2, uint64_t bytes,
                             std::initializer_list<uint32_t> deps, uint8_t flags) {
  return add(reduceStep(dst, src, src2, bytes, flags), std::vector<uint32_t>(deps));
}

uint32_t PlanBuilder::copy(Slice dst, Slice src, uint64_t bytes,
                           std::initializer_list<uint32_t> deps, uint8_t flags) {
  return add(copyStep(dst, src, bytes, flags), std::vector<uint32_t>(deps));
}

uint32_t PlanBuilder::divide(Slice dst, Slice src, uint64_t bytes,
                             std::initializer_list<uint32_t> deps) {
  return add(divideStep(dst, src, bytes), std::vector<uint32_t>(deps));
}

}  // namespace shoal
