// StreamRing: a stream link (transport.h, StreamLink) that CUDA streams
// drive by themselves, shared by the transports whose connections carry one
// (cuda_ipc between processes, loopback between threads of a process).
//
// Role: each direction is a FIFO of `slots` slots of `slotBytes` in GPU
// memory and two words in host memory registered with CUDA. Per chunk, the
// sender's stream waits until the slot is free (the receiver's `consumed`,
// cuStreamWaitValue64), copies the chunk in and writes `published`; the
// receiver's stream waits for `published`, copies it out and writes
// `consumed`. Chunk numbers are counted when messages are enqueued, in call
// order, on both sides. The first chunk of a message carries its tag and
// byte count in the slot's header words; the receiving stream copies them
// into a pinned log that verify() compares with what the receive expected.
// The host reads the words for progress and writes them to release the
// streams of a failed link (release()).
// Owner: the connection that carries it; the memory (FIFOs, words) is the
// transport's, and outlives both sides' rings. Thread: enqueue* and verify()
// on one thread at a time; progress() and release() from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "cuda/driver.h"
#include "transports/transport.h"

namespace shoal {

inline constexpr uint32_t kStreamRingMaxSlots = 64;

// One direction's words (64-bit stream memory operations, cyclic compare).
struct StreamRingLane {
  alignas(64) uint64_t published = 0;  // chunks the sender's stream has copied in
  alignas(64) uint64_t consumed = 0;   // chunks the receiver's stream has copied out
  // Per slot, the tag and byte count of the message whose first chunk it
  // holds, written by the sender's stream before that chunk is published.
  alignas(64) uint64_t headers[kStreamRingMaxSlots][2] = {};
};

// Both directions' words; lanes[s] carries side s's messages. In host
// memory both sides' streams reach (registered or allocated through CUDA).
struct StreamRingWords {
  // Set for good by a side that released the ring (a failed stream plan):
  // neither side enqueues on it again, and a plan still on it fails.
  std::atomic<uint32_t> broken{0};
  StreamRingLane lanes[2];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

class StreamRing final : public StreamLink {
 public:
  struct Setup {
    int side = 0;                      // this end's lane in words->lanes
    StreamRingWords* words = nullptr;  // shared with the other end
    uint8_t* fifo[2] = {nullptr, nullptr};  // lane s's slots, slots x slotBytes of GPU memory
    uint32_t slots = 0;                // 1..kStreamRingMaxSlots
    uint64_t slotBytes = 0;
    std::string peerDescription;
  };
  // Allocates its header log (pinned host memory): the context the
  // streams' GPU copies run in must be current.
  static Result<std::unique_ptr<StreamRing>> make(cuda::Driver& driver, Setup setup);
  // Frees the header log: the same context must be current, and no stream
  // may still copy into it.
  ~StreamRing();
  StreamRing(const StreamRing&) = delete;
  StreamRing& operator=(const StreamRing&) = delete;

  // The connection carrying the ring has failed: enqueue* refuse from now on.
  void markFailed() { connectionFailed_.store(true, std::memory_order_release); }
  // An error once the ring may not be used: released, or the connection failed.
  Status usable() const;

  Status enqueueSend(const void* src, uint64_t bytes, uint64_t tag, void* stream) override;
  Status enqueueRecv(void* dst, uint64_t bytes, uint64_t tag, void* stream) override;
  Progress progress() const override;
  Status verify() override;
  void release() override;
  const std::string& peerDescription() const override { return setup_.peerDescription; }

 private:
  StreamRing(cuda::Driver& driver, Setup setup) : driver_(driver), setup_(std::move(setup)) {}
  uint8_t* slotAddress(int lane, uint64_t chunk) const {
    return setup_.fifo[lane] + chunk % setup_.slots * setup_.slotBytes;
  }

  cuda::Driver& driver_;
  Setup setup_;
  std::atomic<bool> connectionFailed_{false};
  // Chunks enqueued each way (written on the enqueuing thread, read by
  // progress() from any thread).
  std::atomic<uint64_t> sendEnqueued_{0}, recvEnqueued_{0};
  // Received messages' headers, copied by the receiving stream from the
  // slot into a pinned log (entry m % kHeaderLog) before it hands the slot
  // back, and what each receive expected, checked in order by verify().
  static constexpr uint64_t kHeaderLog = 1024;
  // kHeaderLog x {tag, bytes}, then the count of messages whose header the
  // stream has copied (written by the stream after each copy).
  uint64_t* headerLog_ = nullptr;
  uint64_t* headersLogged() const { return headerLog_ + 2 * kHeaderLog; }
  struct Expected {
    uint64_t message = 0, tag = 0, bytes = 0;
  };
  std::mutex expectedMutex_;
  std::deque<Expected> expected_;  // guarded by expectedMutex_
  uint64_t recvMessages_ = 0;
};

}  // namespace shoal
