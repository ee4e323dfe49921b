// CudaIpcConnection: one ordered, tag-checked pipe to a process of the same
// host through GPU memory, both directions (README.md).
//
// Role: the data path of the cuda_ipc transport. Owner: the Communicator that
// asked CudaIpcTransport::connect for it. Thread: used by the engine, by
// whichever thread pumps it, one at a time (transport.h); every poll makes
// the connection's CUDA context current for its duration.
//
// Memory: the lower rank allocates one cuMem allocation on its GPU holding
// both directions' FIFOs (`slots` slots of `slotBytes` each way) and a small
// host control block (a memfd); both descriptors reach the higher rank over
// a Unix socket (SCM_RIGHTS), which imports and maps them. Each direction is
// single-producer single-consumer: the sender copies a chunk of its message
// into a free slot with cuMemcpyAsync on its own stream, and once the copy's
// event has completed publishes it (slot header: tag, message bytes, chunk
// bytes; then `published` with release order); the receiver copies the chunk
// out into the posted buffer on its stream and, once that copy has completed,
// hands the slot back (`consumed`). Two copies per byte, both by the GPU's
// copy engines; the buffers may be device, pinned or pageable host memory.
//
// Stream link: where both sides' GPUs run stream memory operations, the
// allocation holds a second pair of FIFOs that CUDA streams drive themselves
// (StreamLink, stream plans): per chunk, the sender's stream waits until the
// slot is free (the peer's `consumed` word, cuStreamWaitValue64), copies,
// and writes `published`; the receiver's stream waits for `published`,
// copies out and writes `consumed`. The words live in the control block,
// registered with CUDA on both sides, so the host reads them for progress
// and writes them to release the streams of a failed link. Chunk numbers
// are counted when messages are enqueued, in call order, on both sides.
//
// Liveness: the Unix socket stays open for the connection's life, so the
// kernel tells each side when the other process is gone (end of stream);
// a peer that destroys its end sets its `closed` flag. Either is an error
// naming the peer, never a hang, for an operation that waits on the peer;
// the idle check reports only a peer that died (closed on purpose: left).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/driver.h"
#include "net/fd.h"
#include "transports/transport.h"

namespace shoal::cuda_ipc {

inline constexpr uint32_t kControlMagic = 0x32495043;  // "CPI2"
inline constexpr uint32_t kMaxSlots = 64;

struct SlotHeader {
  uint64_t tag = 0;
  uint64_t messageBytes = 0;
  uint64_t chunkBytes = 0;
  uint64_t unused = 0;
};

// One direction's counters and slot headers, in the shared control block.
struct Lane {
  alignas(64) std::atomic<uint64_t> published{0};  // chunks whose bytes are in their slot
  alignas(64) std::atomic<uint64_t> consumed{0};   // chunks the receiver has copied out
  alignas(64) SlotHeader slots[kMaxSlots];
};

// One direction of the stream ring: words CUDA streams wait on and write
// (64-bit stream memory operations, cyclic compare).
struct StreamLane {
  alignas(64) uint64_t published = 0;  // chunks the sender's stream has copied in
  alignas(64) uint64_t consumed = 0;   // chunks the receiver's stream has copied out
  // Per slot, the tag and byte count of the message whose first chunk it
  // holds, written by the sender's stream before that chunk is published.
  alignas(64) uint64_t headers[kMaxSlots][2] = {};
};

// The shared control block; lanes[s] (streamLanes[s]) carries side s's
// messages to the other side.
struct Control {
  uint32_t magic = 0;
  uint32_t slots = 0;
  uint64_t slotBytes = 0;
  uint32_t streamRing = 0;  // 1: the allocation's second FIFO pair is the stream ring
  std::atomic<uint32_t> closed[2];
  // Set for good by a side that released the stream ring (a failed stream
  // plan): neither side enqueues on it again, and a plan still on it fails.
  std::atomic<uint32_t> streamBroken{0};
  Lane lanes[2];
  StreamLane streamLanes[2];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
// Bytes of the control block's mapping.
inline size_t controlBytes() { return (sizeof(Control) + 4095) / 4096 * 4096; }

struct ConnectionSetup {
  int side = 0;                  // 0: the lower rank, which allocated the memory
  cuda::ContextHandle context = nullptr;
  void* fifo = nullptr;          // lane s at s * slots * slotBytes; the stream ring's lane s at 2 + s
  bool fifoIsImported = false;   // side 1 maps the peer's allocation
  bool streamRing = false;       // the stream link is used (control block registered with CUDA)
  Control* control = nullptr;    // mapped, sizeof(Control) rounded to a page
  uint32_t slots = 0;
  uint64_t slotBytes = 0;
  net::Fd socket;                // to the peer, kept open for liveness
  std::string peerDescription;
};

class CudaIpcConnection final : public Connection, private StreamLink {
 public:
  // Takes ownership of everything in `setup`; creates streams and events in
  // its context (which must not be current on another thread's stack only).
  static Result<std::unique_ptr<CudaIpcConnection>> make(ConnectionSetup setup);
  ~CudaIpcConnection() override;
  // The lower rank connects its socket once the connection owns the memory.
  void adoptSocket(net::Fd socket) { setup_.socket = std::move(socket); }

  Status postSend(const void* data, uint64_t bytes, uint64_t tag, uint64_t token) override;
  Status postRecv(void* data, uint64_t bytes, uint64_t tag, uint64_t token) override;
  Status poll(std::vector<Completion>& done, bool& progressed) override;
  size_t pending() const override { return sends_.size() + recvs_.size() + sendCopies_.size() + recvCopies_.size(); }
  bool mightProgress() const override;
  Status checkAlive() override;
  void quiesce() override { (void)fail(error(Code::kAborted, "the operation using this connection ended")); }
  const std::string& peerDescription() const override { return setup_.peerDescription; }
  StreamLink* streamLink() override { return setup_.streamRing ? this : nullptr; }

 private:
  // StreamLink.
  Status enqueueSend(const void* src, uint64_t bytes, uint64_t tag, void* stream) override;
  Status enqueueRecv(void* dst, uint64_t bytes, uint64_t tag, void* stream) override;
  Progress progress() const override;
  Status verify() override;
  void release() override;
  // An error once the ring may not be used: released, or the connection failed.
  Status usableStreamRing() const;

  explicit CudaIpcConnection(ConnectionSetup setup);

  struct Op {
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
    uint64_t tag = 0;
    uint64_t token = 0;
    uint64_t offset = 0;   // bytes handed to copies so far
    bool started = false;  // at least one chunk issued (zero-byte messages have one)
  };
  // A chunk whose copy was issued and has not been published/handed back.
  struct Copy {
    uint32_t slot = 0;
    bool hasEvent = false;  // zero-byte chunks copy nothing
    bool lastOfMessage = false;
    uint64_t token = 0;
    uint64_t messageBytes = 0;
  };

  uint8_t* slotAddress(int lane, uint64_t chunk) const;
  Status issueSends(bool& progressed);
  Status issueRecvs(bool& progressed);
  Status retire(std::deque<Copy>& copies, const std::vector<cuda::EventHandle>& events,
                std::atomic<uint64_t>& counter, uint64_t& count, std::vector<Completion>& done, bool& progressed);
  // Whether nothing can move until the peer does (no copy of ours running,
  // a send waiting for a free slot or a receive for a chunk).
  bool waitsOnPeer() const;
  // The peer's closed flag and its process (the socket's end of stream).
  Status lookAtPeer(bool idle);
  Status fail(Status status);

  ConnectionSetup setup_;
  Lane* out_ = nullptr;  // lanes[side]
  Lane* in_ = nullptr;   // lanes[1 - side]
  cuda::StreamHandle sendStream_ = nullptr;
  cuda::StreamHandle recvStream_ = nullptr;
  std::vector<cuda::EventHandle> sendEvents_, recvEvents_;  // one per slot
  std::deque<Op> sends_, recvs_;
  std::deque<Copy> sendCopies_, recvCopies_;
  uint64_t sendIssued_ = 0;     // chunks this side has started copying in
  uint64_t sendPublished_ = 0;  // == out_->published
  uint64_t peerConsumed_ = 0;   // cached out_->consumed
  uint64_t recvIssued_ = 0;     // chunks this side has started copying out
  uint64_t recvConsumed_ = 0;   // == in_->consumed
  uint32_t idlePolls_ = 0;
  Status failed_;
  std::atomic<bool> hostRingFailed_{false};  // failed_ is set (read by the enqueuing thread)
  // The stream ring: chunks enqueued each way (written on the enqueuing
  // thread, read by progress() from any thread).
  std::atomic<uint64_t> streamSendEnqueued_{0}, streamRecvEnqueued_{0};
  // Received messages' headers, copied by the receiving stream from the
  // slot into a pinned log (entry m % kHeaderLog) before it hands the slot
  // back, and what each receive expected, checked in order by verify().
  static constexpr uint64_t kHeaderLog = 1024;
  // kHeaderLog x {tag, bytes}, then the count of messages whose header the
  // stream has copied (written by the stream after each copy).
  uint64_t* headerLog_ = nullptr;
  uint64_t* headersLogged() const { return headerLog_ + 2 * kHeaderLog; }
  struct Expected {
    uint64_t message = 0, firstChunk = 0, tag = 0, bytes = 0;
  };
  std::mutex expectedMutex_;
  std::deque<Expected> expected_;  // guarded by expectedMutex_
  uint64_t streamRecvMessages_ = 0;
};

}  // namespace shoal::cuda_ipc
