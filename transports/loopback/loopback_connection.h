// LoopbackConnection: one endpoint of an in-process pipe (see loopback_transport.h).
// A message is copied once from the sender's buffer into the receiver's: by
// memcpy, or by the GPU when either is device memory (ranks of one process
// passing device buffers to device plans: Transport::movesDeviceMemory).
//
// Stream link: where the communicator's ranks agreed on stream links
// (ConnectOptions::streamLinks) and the GPU's streams run stream plans, the
// pipe also holds a stream ring (transports/stream_ring): FIFOs in GPU
// memory and words in pinned host memory, allocated by the end that made
// the pipe, on which both ends' streams run stream plans with no host step.
//
// Lifetime: a Pipe is shared by its two endpoints (shared_ptr); each endpoint
// belongs to one communicator and is polled only by the engine. The pipe mutex
// orders the two endpoints, which may be polled by different threads over time.
// The ring's memory lives with the pipe, so until both ends are gone.
#pragma once

#include <deque>
#include <memory>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/driver.h"
#include "transports/loopback/loopback_transport.h"
#include "transports/stream_ring/stream_ring.h"

namespace shoal {

struct LoopbackPipe {
  struct PendingSend {
    const void* data;
    uint64_t bytes;
    uint64_t tag;
    uint64_t token;
    int64_t readyAtNs;
    bool blackhole;
  };
  struct PendingRecv {
    void* data;
    uint64_t bytes;
    uint64_t tag;
    uint64_t token;
  };
  // Messages from one side to the other.
  struct Direction {
    std::deque<PendingSend> sends;
    std::deque<PendingRecv> recvs;
    std::vector<Completion> senderDone;
    std::vector<Completion> receiverDone;
  };

  // `driver`: CUDA's, where the process used it when the pipe was made
  // (device buffers may then cross it), else null.
  LoopbackPipe(const LoopbackFaults& faults, cuda::Driver* driver);
  ~LoopbackPipe();
  LoopbackPipe(const LoopbackPipe&) = delete;
  LoopbackPipe& operator=(const LoopbackPipe&) = delete;
  // Copies a matched message (mutex held): memcpy, or by the GPU where
  // either side is device memory, which host code must not touch.
  Status copyMessage(void* dst, const void* src, uint64_t bytes);

  std::mutex mutex;
  Direction directions[2];
  bool closed[2] = {false, false};
  Status failure;  // set once; fails both endpoints
  LoopbackFaults faults;
  int64_t messagesPosted = 0;  // counts fail_nth / blackhole_nth per pipe
  int madeBy = -1;             // the rank whose connect made it (set before it is shared)
  bool attached[2] = {false, false};  // an end's connect took the pipe (set with the transport's lock)
  // Takes the pipe out of the transport's table of pipes waiting for their
  // second end (set before it is shared): its only end closed before the
  // peer came, so nobody will, and its ring memory goes with it.
  std::function<void()> forget;
  std::mt19937_64 stallRng;

  // Slots per direction of the stream ring.
  static constexpr uint32_t kRingSlots = 8;
  // The stream ring's memory, both directions: made (in `context`, current
  // on the calling thread) before the pipe is shared, freed with it.
  struct RingMemory {
    cuda::ContextHandle context = nullptr;
    StreamRingWords* words = nullptr;  // pinned host memory
    uint8_t* fifo = nullptr;           // 2 x slots x slotBytes of GPU memory
    uint32_t slots = 0;
    uint64_t slotBytes = 0;
  };
  Status makeRing(cuda::ContextHandle context, uint64_t bytesPerDirection);
  // Fails the pipe for both ends (the first failure stays) and breaks its
  // stream ring; what failed it, or OK.
  void fail(const Status& status);
  Status failed();
  const RingMemory* ring() const { return ring_.words ? &ring_ : nullptr; }
  // Frees the ring's memory (no stream may use it any more).
  void freeRing();

 private:
  // A GPU copy in `context`, waited for before the message completes.
  Status copyOnGpu(cuda::ContextHandle context, void* dst, const void* src, uint64_t bytes);

  cuda::Driver* driver_;
  RingMemory ring_;
};

class LoopbackConnection final : public Connection {
 public:
  // Sends on directions[sendDir], receives on directions[recvDir] (equal for a
  // connection to oneself). `side` is this endpoint's index in pipe.closed.
  LoopbackConnection(std::shared_ptr<LoopbackPipe> pipe, int side, int sendDir, int recvDir,
                     std::string peerDescription);
  ~LoopbackConnection() override;

  Status postSend(const void* data, uint64_t bytes, uint64_t tag, uint64_t token) override;
  Status postRecv(void* data, uint64_t bytes, uint64_t tag, uint64_t token) override;
  Status poll(std::vector<Completion>& done, bool& progressed) override;
  size_t pending() const override { return pending_; }
  const std::string& peerDescription() const override { return peerDescription_; }
  StreamLink* streamLink() override { return ring_.get(); }
  // A peer that destroyed or aborted its end while this one still waits
  // for it (host messages pending, or stream ring chunks its streams have
  // not passed) is an error; one that left with nothing owed is not.
  Status checkAlive() override;
  // The job using this end ended without its messages: the peer's poll
  // delivers both directions, so this end's queued sends and receives go
  // (a late peer would otherwise copy into or out of buffers their caller
  // has been told are free), and the pipe fails for both ends.
  void quiesce() override;

  // This end of the pipe's stream ring (the pipe must have one), its
  // streams' copies run in `context` (current on the calling thread).
  Status attachRing(cuda::Driver& driver, cuda::ContextHandle context);

 private:
  Status deliver(LoopbackPipe::Direction& dir, bool& progressed);

  std::shared_ptr<LoopbackPipe> pipe_;
  int side_;
  int sendDir_;
  int recvDir_;
  std::string peerDescription_;
  size_t pending_ = 0;
  bool used_ = false;  // an operation was posted here (the pipe's peer may wait for it)
  cuda::ContextHandle ringContext_ = nullptr;
  std::unique_ptr<StreamRing> ring_;
};

}  // namespace shoal
