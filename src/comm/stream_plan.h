// StreamPlans: a communicator's operations that CUDA streams run by
// themselves, with no host step (docs/cuda.md, "Stream plans").
//
// Role: when every lane of an operation's (or a group's merged) plan has a stream link
// (StreamLink: cuda_ipc's stream ring) and its compute steps run on the GPU
// (deviceStepsCanRun), the whole plan is enqueued when the user calls, on
// the user's stream and one stream per lane: a Send or Recv is its link's
// chunked wait/copy/publish on its lane's stream, a Reduce a reduction
// kernel and a Copy a cuMemcpyAsync on the user's stream, and each
// dependency between two streams an event. The user's stream starts the
// lanes (an event) and waits for them at the end; a communicator's plans run
// one after another (each waits for the previous one's end), as the chunk
// numbers of its links assume. The engine only watches (StreamPlanWatch,
// the engine's StreamWatch): the end, progress for the no-progress
// deadline, and, when a plan fails, releasing its links' waits so that no
// stream waits for ever.
//
// Owner: the Communicator, made by its first stream plan, in the context
// current then (the lane streams are created there). Thread: enqueue() on
// the communicator's user thread; watches on the engine's.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collectives/plan.h"
#include "cuda/device_reducer.h"
#include "cuda/driver.h"
#include "engine/engine.h"
#include "transports/transport.h"

namespace shoal {

// Each stream of `waiting` waits for the work enqueued so far on each of
// `from` (an event per stream of `from`), in the current context.
Status joinStreams(cuda::Driver& driver, std::span<const cuda::StreamHandle> from,
                   std::span<const cuda::StreamHandle> waiting);

class StreamPlans {
 public:
  // In the context current on the calling thread, whose reduction kernels
  // `reducer` holds. `scratchOwner` owns the scratch the plans use (kept
  // while a stream may use it).
  StreamPlans(cuda::Driver& driver, const cuda::DeviceReducer& reducer, std::shared_ptr<void> scratchOwner)
      : driver_(driver), reducer_(reducer), scratchOwner_(std::move(scratchOwner)) {
    Result<cuda::ContextHandle> current = driver_.currentContext();
    if (current.isOk()) context_ = current.value();
  }
  // Waits up to waitMs until the streams have passed every plan enqueued
  // here and frees the lane streams: true. False when a stream still holds
  // a plan then; nothing is freed (the caller keeps the connections and
  // scratch too) and a later call goes on waiting (comm/deferred_release.h).
  // The communicator's jobs are retired first, so their links are released
  // and no plan waits for a peer.
  bool settle(int64_t waitMs);
  ~StreamPlans();
  StreamPlans(const StreamPlans&) = delete;
  StreamPlans& operator=(const StreamPlans&) = delete;

  // Whether every lane's connection has a stream link.
  static bool linksAll(const std::vector<Connection*>& laneConnections);
  // Kept while a stream may still use it (a window board), with the scratch.
  void hold(std::shared_ptr<void> owner) { held_.push_back(std::move(owner)); }

  // What one plan needs besides the plan itself.
  struct Launch {
    const Plan* plan = nullptr;
    std::span<uint8_t* const> buffers;               // per plan buffer index (device-reachable)
    std::span<StreamLink* const> laneLinks;          // per plan lane
    // A peer-reading plan's (Plan::readsPeers) peers' send and receive
    // buffers, per rank, where this process reaches them (empty otherwise).
    std::span<const std::array<uint8_t*, 2>> peerBuffers;
    std::span<const OpScalar> scalars;               // per op; PreMulSum: host bytes or a device element
    cuda::StreamHandle stream = nullptr;             // the user's stream (a group's first)
    const uint64_t* doneWord = nullptr;              // written (>= seq) by the stream after the plan
    uint64_t seq = 0;
    std::span<const uint64_t> tags;                  // per op (core/tag.h), carried by its messages
    std::string label;                               // for the deadline's message
  };
  // Enqueues the plan; the watch is the engine job's. On failure part of it
  // may be on the streams already: the caller fails the communicator and
  // releases the links (the watch's release does it).
  Result<std::shared_ptr<StreamWatch>> enqueue(const Launch& launch);

 private:
  Status enqueueSteps(const Launch& launch);
  Result<cuda::StreamHandle> laneStream(size_t lane);
  Status runCompute(const Launch& launch, const Step& s);
  static uint8_t* at(const Launch& launch, const Slice& slice);

  cuda::Driver& driver_;
  const cuda::DeviceReducer& reducer_;
  std::shared_ptr<void> scratchOwner_;
  std::vector<std::shared_ptr<void>> held_;
  cuda::ContextHandle context_ = nullptr;  // the lane streams' (current when made)
  std::vector<cuda::StreamHandle> laneStreams_;
  bool settled_ = false;
  // Every link a plan has used, and whether a plan has released its links
  // (a failed job): settle() then releases them again while it waits, as a
  // peer's streams still running may have overwritten the release.
  std::vector<StreamLink*> links_;
  std::shared_ptr<std::atomic<bool>> released_ = std::make_shared<std::atomic<bool>>(false);
  // Recorded on the user's stream at the end of the last plan enqueued:
  // the next plan's streams start after it.
  cuda::EventHandle tail_ = nullptr;
  std::vector<cuda::EventHandle> events_;  // reused by every plan (enqueueSteps)
  bool anyEnqueued_ = false;
  // settle(): the lanes' ends, recorded by its first call, and how many of
  // them the streams have passed; lost where an end could not be recorded.
  std::vector<cuda::EventHandle> ends_;
  size_t endsPassed_ = 0;
  bool endsRecorded_ = false;
  bool endsLost_ = false;
};

}  // namespace shoal
