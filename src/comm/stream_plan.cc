#include "comm/stream_plan.h"

#include <algorithm>

#include "comm/device_steps.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/params.h"

namespace shoal {
namespace {

// The engine's view of one enqueued plan.
class StreamPlanWatch final : public StreamWatch {
 public:
  struct Link {
    StreamLink* link = nullptr;
    int peer = -1;
    StreamLink::Progress target;  // the counts once this plan has passed
  };
  StreamPlanWatch(const uint64_t* doneWord, uint64_t seq, std::vector<Link> links,
                  std::shared_ptr<std::atomic<bool>> released)
      : doneWord_(doneWord), seq_(seq), links_(std::move(links)), released_(std::move(released)) {}

  bool finished() override { return streamWordReached(doneWord_, seq_); }

  Status verify() override {
    // A link found broken fails the plan even when its streams have passed
    // it: a peer's released streams may have fed it whatever bytes were
    // there (a plan that passed before the break is failed with it, the
    // communicator being lost either way).
    for (const Link& l : links_) SHOAL_TRY(l.link->verify());
    return Status::ok();
  }

  bool moved() override {
    uint64_t seen = 0;
    for (const Link& l : links_) {
      StreamLink::Progress p = l.link->progress();
      seen += p.sent + p.received;
    }
    bool changed = seen != lastSeen_;
    lastSeen_ = seen;
    return changed;
  }

  std::string waitingOn(std::vector<int>& peers) override {
    std::string list;
    for (const Link& l : links_) {
      StreamLink::Progress p = l.link->progress();
      auto behind = [](uint64_t done, uint64_t target) { return static_cast<int64_t>(done - target) < 0; };
      std::string what;
      if (p.sendWaitsForPeer && behind(p.sent, l.target.sendEnqueued))
        what = str("send to ", l.link->peerDescription(), " (the peer has taken chunk ", p.sent, " of ",
                   l.target.sendEnqueued, ")");
      if (behind(p.received, l.target.recvEnqueued))
        what += str(what.empty() ? "" : "; ", "receive from ", l.link->peerDescription(),
                    " (the peer has published chunk ", p.received, " of ", l.target.recvEnqueued, ")");
      if (what.empty()) continue;
      list += (list.empty() ? "" : "; ") + what;
      if (std::find(peers.begin(), peers.end(), l.peer) == peers.end()) peers.push_back(l.peer);
    }
    return list.empty() ? std::string("the device work of a stream plan (every chunk has moved)")
                        : list + " (stream plan: ranks may have called different operations or counts)";
  }

  void release() override {
    released_->store(true, std::memory_order_release);
    for (const Link& l : links_) l.link->release();
  }

 private:
  const uint64_t* doneWord_;
  uint64_t seq_;
  std::vector<Link> links_;
  std::shared_ptr<std::atomic<bool>> released_;
  uint64_t lastSeen_ = 0;
};

}  // namespace

bool StreamPlans::settle(int64_t waitMs) {
  if (settled_) return true;
  // Its own context, whatever the calling thread has current (a destroy
  // from another thread, or with no context).
  cuda::ContextScope scope(driver_, context_);
  if (!scope.entered()) {
    SHOAL_WARN("stream plans: cannot make their CUDA context current to wait for their streams; their device "
               "memory is not freed");
    return false;
  }
  if (!laneStreams_.empty() || tail_ != nullptr) {
    if (!endsRecorded_) {
      // Every plan's end (the user's stream waited for each lane before
      // recording the tail), and each lane's own end: a plan whose
      // enqueueing failed part way left lane work the tail does not cover.
      endsRecorded_ = true;
      for (cuda::StreamHandle lane : laneStreams_) {
        Result<cuda::EventHandle> e = driver_.createEvent();
        if (!e.isOk()) {
          endsLost_ = true;
          continue;
        }
        if (driver_.recordEvent(e.value(), lane).isOk()) {
          ends_.push_back(e.value());
        } else {
          driver_.destroyEvent(e.value());
          endsLost_ = true;  // a lane whose end cannot be known: nothing is freed
        }
      }
    }
    if (endsLost_) return false;
    Deadline deadline = Deadline::afterMs(std::max<int64_t>(waitMs, 1));
    Backoff backoff;
    for (;;) {
      while (endsPassed_ < ends_.size()) {
        Result<bool> done = driver_.eventDone(ends_[endsPassed_]);
        if (!done.isOk()) {
          endsLost_ = true;
          return false;
        }
        if (!done.value()) break;
        ++endsPassed_;
      }
      bool tailDone = true;
      if (endsPassed_ == ends_.size() && tail_) {
        Result<bool> done = driver_.eventDone(tail_);
        if (!done.isOk()) {
          endsLost_ = true;
          return false;
        }
        tailDone = done.value();
      }
      if (endsPassed_ == ends_.size() && tailDone) break;
      if (deadline.expired()) return false;
      // Released links stay released while we wait (a peer's streams may
      // still write the words ours wait on).
      if (released_->load(std::memory_order_acquire))
        for (StreamLink* link : links_) link->release();
      backoff.pause();
    }
  }
  for (cuda::EventHandle e : ends_) driver_.destroyEvent(e);
  ends_.clear();
  for (cuda::StreamHandle lane : laneStreams_) driver_.destroyStream(lane);  // every lane has passed
  laneStreams_.clear();
  if (tail_) driver_.destroyEvent(tail_);
  tail_ = nullptr;
  for (cuda::EventHandle e : events_) driver_.destroyEvent(e);
  events_.clear();
  settled_ = true;
  return true;
}

StreamPlans::~StreamPlans() {
  // Unsettled (settle() timed out): the streams and event are kept with
  // the memory they may still use.
  if (!settled_) {
    new std::shared_ptr<void>(std::move(scratchOwner_));
    new std::vector<std::shared_ptr<void>>(std::move(held_));
  }
}

bool StreamPlans::linksAll(const std::vector<Connection*>& laneConnections) {
  if (laneConnections.empty()) return false;
  for (Connection* c : laneConnections)
    if (c == nullptr || c->streamLink() == nullptr) return false;
  return true;
}

Result<cuda::StreamHandle> StreamPlans::laneStream(size_t lane) {
  while (laneStreams_.size() <= lane) {
    SHOAL_ASSIGN_OR_RETURN(cuda::StreamHandle s, driver_.createStream(), "a stream plan's lane stream");
    laneStreams_.push_back(s);
  }
  return laneStreams_[lane];
}

uint8_t* StreamPlans::at(const Launch& launch, const Slice& slice) {
  if (slice.buffer == kWindowBuffer) return nullptr;  // descriptors: the board link writes its own
  if (isPeerBuffer(slice.buffer)) {
    const auto& bases = launch.peerBuffers[static_cast<size_t>(peerOfBuffer(slice.buffer))];
    return bases[localKindOfPeerBuffer(slice.buffer) == kSendBuffer ? 0 : 1] + slice.offset;
  }
  return launch.buffers[slice.buffer] + slice.offset;
}

Status StreamPlans::runCompute(const Launch& launch, const Step& s) {
  const Plan& plan = *launch.plan;
  const CollShape& shape = plan.shapes[s.op];
  uint8_t* dst = at(launch, s.dst);
  const uint8_t* a = at(launch, s.src);
  if (s.kind == StepKind::kCopy) {
    if (dst == a) return Status::ok();  // in place
    return driver_.copyAsync(dst, a, s.bytes, launch.stream);
  }
  const uint8_t* b = at(launch, s.src2);
  const ReduceOp op = combineOpOf(s, shape);
  cuda::ReduceScalar scalar;
  if (op == ReduceOp::kPreMulSum) {
    if (s.op >= launch.scalars.size()) return internalError("stream plan: PreMulSum without its scalar");
    const OpScalar& given = launch.scalars[s.op];
    scalar = given.deviceScalar ? cuda::ReduceScalar::onDevice(given.deviceScalar)
                                : cuda::ReduceScalar::element(shape.dtype, given.bytes.data());
  }
  return reducer_.launch(dst, a, b, s.bytes / dataTypeSize(shape.dtype), shape.dtype, elementOpOf(op), scalar,
                          launch.stream);
}

Status StreamPlans::enqueueSteps(const Launch& launch) {
  const Plan& plan = *launch.plan;
  const size_t n = plan.steps.size();
  // The stream of each step: its lane's for Send/Recv, the user's otherwise.
  std::vector<cuda::StreamHandle> streamOf(n, launch.stream);
  for (size_t i = 0; i < n; ++i) {
    const Step& s = plan.steps[i];
    if (s.kind == StepKind::kSend || s.kind == StepKind::kRecv) {
      SHOAL_ASSIGN_OR_RETURN(streamOf[i], laneStream(static_cast<size_t>(s.lane)));
    }
  }
  // Events come from a pool kept across plans: a wait takes the event's
  // record as it stands when the wait is enqueued, so recording it again
  // for the next plan leaves this plan's waits as they were.
  size_t used = 0;
  auto recordOn = [&](cuda::StreamHandle stream) -> Result<cuda::EventHandle> {
    if (used == events_.size()) {
      SHOAL_ASSIGN_OR_RETURN(cuda::EventHandle fresh, driver_.createEvent());
      events_.push_back(fresh);
    }
    cuda::EventHandle e = events_[used++];
    SHOAL_TRY(driver_.recordEvent(e, stream));
    return e;
  };

  // The previous plan's end, then the lanes' start.
  if (anyEnqueued_) {
    SHOAL_TRY(driver_.streamWaitEvent(launch.stream, tail_));
  }
  std::vector<size_t> lanesUsed;
  for (size_t lane = 0; lane < plan.lanes.size(); ++lane) lanesUsed.push_back(lane);
  SHOAL_ASSIGN_OR_RETURN(cuda::EventHandle start, recordOn(launch.stream));
  for (size_t lane : lanesUsed) SHOAL_TRY(driver_.streamWaitEvent(laneStreams_[lane], start));

  // A step's event, recorded right after it where a step on another stream
  // depends on it.
  std::vector<uint8_t> crossDependent(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const Step& s = plan.steps[i];
    for (uint32_t k = 0; k < s.depCount; ++k) {
      uint32_t d = plan.deps[s.depBegin + k];
      if (streamOf[d] != streamOf[i]) crossDependent[d] = 1;
    }
  }
  std::vector<cuda::EventHandle> after(n, nullptr);
  std::vector<std::pair<cuda::StreamHandle, uint32_t>> latest;  // per other stream: its last dependency
  for (size_t i = 0; i < n; ++i) {
    const Step& s = plan.steps[i];
    // One wait per other stream, for its latest dependency (a stream runs in order).
    latest.clear();
    for (uint32_t k = 0; k < s.depCount; ++k) {
      uint32_t d = plan.deps[s.depBegin + k];
      if (streamOf[d] == streamOf[i]) continue;
      auto it = std::find_if(latest.begin(), latest.end(), [&](const auto& e) { return e.first == streamOf[d]; });
      if (it == latest.end()) latest.emplace_back(streamOf[d], d);
      else it->second = std::max(it->second, d);
    }
    for (const auto& [stream, d] : latest) SHOAL_TRY(driver_.streamWaitEvent(streamOf[i], after[d]));
    switch (s.kind) {
      case StepKind::kSend:
        SHOAL_TRY(launch.laneLinks[s.lane]->enqueueSend(at(launch, s.src), s.bytes, launch.tags[s.op], streamOf[i]))
            << "send to " << launch.laneLinks[s.lane]->peerDescription();
        break;
      case StepKind::kRecv:
        SHOAL_TRY(launch.laneLinks[s.lane]->enqueueRecv(at(launch, s.dst), s.bytes, launch.tags[s.op], streamOf[i]))
            << "receive from " << launch.laneLinks[s.lane]->peerDescription();
        break;
      default:
        SHOAL_TRY(runCompute(launch, s)) << stepKindName(s.kind) << " step " << i;
        break;
    }
    if (crossDependent[i]) {
      SHOAL_ASSIGN_OR_RETURN(after[i], recordOn(streamOf[i]));
    }
  }
  // The user's stream goes on once every lane has passed the plan.
  for (size_t lane : lanesUsed) {
    SHOAL_ASSIGN_OR_RETURN(cuda::EventHandle end, recordOn(laneStreams_[lane]));
    SHOAL_TRY(driver_.streamWaitEvent(launch.stream, end));
  }
  return Status::ok();
}

Status joinStreams(cuda::Driver& driver, std::span<const cuda::StreamHandle> from,
                   std::span<const cuda::StreamHandle> waiting) {
  if (from.empty() || waiting.empty()) return Status::ok();
  for (cuda::StreamHandle f : from) {
    SHOAL_ASSIGN_OR_RETURN(cuda::EventHandle e, driver.createEvent(), "joining a group's streams");
    Status st = driver.recordEvent(e, f);
    for (size_t i = 0; st.isOk() && i < waiting.size(); ++i) st = driver.streamWaitEvent(waiting[i], e);
    driver.destroyEvent(e);  // freed once its work is done
    SHOAL_TRY(st) << "joining a group's streams";
  }
  return Status::ok();
}

Result<std::shared_ptr<StreamWatch>> StreamPlans::enqueue(const Launch& launch) {
  if (tail_ == nullptr) {
    SHOAL_ASSIGN_OR_RETURN(tail_, driver_.createEvent(), "stream plans");
  }
  Status st = enqueueSteps(launch);
  // However far it got, the next plan starts after this one's streams.
  Status tail = driver_.recordEvent(tail_, launch.stream);
  if (tail.isOk()) anyEnqueued_ = true;
  if (st.isOk()) st = tail;

  std::vector<StreamPlanWatch::Link> links;
  for (size_t lane = 0; lane < launch.plan->lanes.size(); ++lane) {
    StreamLink* link = launch.laneLinks[lane];
    if (std::any_of(links.begin(), links.end(), [&](const auto& l) { return l.link == link; })) continue;
    links.push_back(StreamPlanWatch::Link{link, launch.plan->lanes[lane].peer, link->progress()});
    if (std::find(links_.begin(), links_.end(), link) == links_.end()) links_.push_back(link);
  }
  auto watch = std::make_shared<StreamPlanWatch>(launch.doneWord, launch.seq, std::move(links), released_);
  if (!st.isOk()) {
    watch->release();  // nothing of ours waits for a plan its peers will not complete
    return StatusBuilder(std::move(st)) << launch.label << ": enqueueing a stream plan";
  }
  return std::shared_ptr<StreamWatch>(std::move(watch));
}

}  // namespace shoal
