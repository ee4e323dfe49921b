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
// (a StreamRing, transports/stream_ring; stream plans). Its words live in
// the control block, registered with CUDA on both sides.
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
#include "transports/stream_ring/stream_ring.h"
#include "transports/transport.h"

namespace shoal::cuda_ipc {

inline constexpr uint32_t kControlMagic = 0x33495043;  // "CPI3"
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

static_assert(kMaxSlots <= kStreamRingMaxSlots);

// The shared control block; lanes[s] (streamWords.lanes[s]) carries side
// s's messages to the other side.
struct Control {
  uint32_t magic = 0;
  uint32_t slots = 0;
  uint64_t slotBytes = 0;
  uint32_t streamRing = 0;  // 1: the allocation's second FIFO pair is the stream ring
  std::atomic<uint32_t> closed[2];
  Lane lanes[2];
  StreamRingWords streamWords;
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

class CudaIpcConnection final : public Connection {
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
  StreamLink* streamLink() override { return ring_.get(); }

 private:
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
  std::unique_ptr<StreamRing> ring_;  // where setup_.streamRing
};

}  // namespace shoal::cuda_ipc
