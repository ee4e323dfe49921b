// ShmConnection: one ordered, tag-checked pipe to a process on the same host
// through a shared-memory segment (shm_segment.h), both directions.
//
// Role: the data path of the shm transport (README.md). Owner: the
// Communicator that asked ShmTransport::connect for it. Thread: used only by
// the engine, by whichever thread pumps it, one at a time (transport.h); no
// locks, and no system call on the small-message path.
//
// Frames: each direction is a single-producer single-consumer ring of 64-byte
// slots. A message travels as one or more frames; a frame is a 32-byte header
// followed by its payload, contiguous modulo the ring. The header's `stamp`
// (frame number + 1) is stored last with release order: the receiver polls
// the stamp of the slot where the next frame must start ("flag in the data"),
// so a message of up to 32 bytes costs the receiver one cache line. The
// receiver hands slots back by publishing how many it has consumed; the sender
// reads that only when its cached copy says the ring is full.
//
// Large messages: when the receiver can read the sender's memory
// (process_vm_readv works between the two processes, probed at connect), a
// message of at least SHOAL_SHM_CMA_MIN_BYTES is sent as a one-slot
// descriptor (address, size) and the receiver copies it straight from the
// sender's buffer into its own: one copy. The send completes when the
// receiver publishes that it has read it. Otherwise large messages are cut
// into frames of up to a quarter of the ring and stream through it.
//
// Set-up never blocks: the lower rank creates the segment in connect(), the
// higher rank maps it in its first poll() that finds it. Liveness: when a
// poll moves nothing, the peer's `closed` flag and (every 10 ms) its process
// (pidfd) are checked, so a peer that exits or is killed becomes an error
// naming it, never a hang.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/ring_queue.h"
#include "net/fd.h"
#include "transports/shm/shm_segment.h"
#include "transports/transport.h"

namespace shoal::shm {

struct ConnectionSetup {
  int side = 0;                  // 0: creator (lower rank), 1: opener
  std::string segmentName;
  std::string secret;
  Segment segment;               // side 0: created; side 1: empty until mapped
  int peerPid = 0;
  CmaAbility selfCanRead = CmaAbility::kNo;
  uint64_t cmaMinBytes = 0;
  Deadline attachDeadline = Deadline::never();
  std::string peerDescription;
};

class ShmConnection final : public Connection {
 public:
  explicit ShmConnection(ConnectionSetup setup);
  ~ShmConnection() override;

  Status postSend(const void* data, uint64_t bytes, uint64_t tag, uint64_t token) override;
  Status postRecv(void* data, uint64_t bytes, uint64_t tag, uint64_t token) override;
  Status postSendOrFinish(const void* data, uint64_t bytes, uint64_t tag, uint64_t token,
                          bool& finished) override;
  // Frames copied out of the ring (not read by single copy) can be reduced
  // out of it instead.
  bool reducesOnReceive(uint64_t bytes) const override {
    return attached_ && !(selfCanRead_ == CmaAbility::kYes && bytes >= cmaMinBytes_);
  }
  Status postRecvReduce(const ReduceOnReceive& r, uint64_t bytes, uint64_t tag, uint64_t token) override;
  Status poll(std::vector<Completion>& done, bool& progressed) override;
  size_t pending() const override {
    return sends_.size() + cmaWaits_.size() + recvs_.size() + writtenAtPost_.size();
  }
  // False on exactly the passes poll() returns from at once (its idle path).
  bool mightProgress() const override {
    return !failure_.isOk() || !attached_ || !writtenAtPost_.empty() || hasWork();
  }
  const std::string& peerDescription() const override { return peer_; }
  // The peer's process (pidfd), its `closed` flag and a failure it
  // published: a killed or failed peer is seen at the next check.
  Status checkAlive() override;
  // A job ended without its operations here (failed, aborted): the
  // connection fails for good, so that no later poll (another job's) moves
  // their bytes into or out of buffers their owner has been told are done.
  void quiesce() override { (void)fail(quiescedError(peer_)); }
  bool carriesFailureReports() const override { return true; }
  // Only a peer that has mapped the segment can write its report there: a
  // failing rank does not wait for one that never attached.
  bool failureReportsArriveUnread() const override;
  void publishFailure(std::string_view reason, bool final) override;
  std::string peerFailure() const override;
  bool peerFailureFinal() const override;

  // For tests: whether large messages to the peer go by single copy.
  bool singleCopyToPeer() const { return peerCanRead_ == CmaAbility::kYes; }

 private:
  struct SendOp {
    const uint8_t* data = nullptr;
    uint64_t bytes = 0;
    uint64_t tag = 0;
    uint64_t token = 0;
    uint64_t offset = 0;  // payload bytes already framed
  };
  struct RecvOp {
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
    uint64_t tag = 0;
    uint64_t token = 0;
    uint64_t offset = 0;  // payload bytes already received
    bool reduces = false;  // postRecvReduce: `reduce` says where the bytes go, data is null
    ReduceOnReceive reduce;
  };
  struct CmaWait {
    uint64_t token = 0;
    uint64_t bytes = 0;
    uint64_t index = 0;  // single-copy message number in this direction
  };

  Status attach();
  Status pumpSends(std::vector<Completion>& done, bool& progressed);
  Status pumpRecvs(std::vector<Completion>& done, bool& progressed);
  // Reads the rest of a single-copy message into `into` (the receive's
  // buffer, or staging), advancing op.offset.
  Status readSingleCopy(RecvOp& op, uint8_t* into, uint64_t address, bool& finished);
  // Delivers `n` payload bytes at `from` to a receive, at message offset `at`.
  void deliver(const RecvOp& op, uint64_t at, const uint8_t* from, uint64_t n);
  // Whether the peer closed, exited or (attaching) missed its deadline.
  Status checkPeer(bool attaching);
  // Idle passes check the peer every 16th time: the flag and the clock are
  // both off the waiting path.
  bool peerCheckDue() { return ++idlePolls_ % 16 == 0; }
  // Something to write, a single-copy send to see read, or a frame arrived
  // for a posted receive: what poll()'s idle path checks.
  bool hasWork() const {
    return !sends_.empty() || !cmaWaits_.empty() || (!recvs_.empty() && frameArrived());
  }
  // The next frame of the in ring has arrived: its stamp (the first word of
  // its first slot, FrameHeader::stamp) is the next one.
  bool frameArrived() const {
    const auto* stamp = reinterpret_cast<const std::atomic<uint64_t>*>(inRing_ + (readSlots_ & slotMask_) * kSlotBytes);
    return stamp->load(std::memory_order_acquire) == readFrames_ + 1;
  }
  uint64_t freeSlots();
  // A send's next frame carries only its address (the peer reads it directly).
  bool singleCopySend(uint64_t bytes, uint64_t offset) const {
    return peerCanRead_ == CmaAbility::kYes && bytes >= cmaMinBytes_ && offset == 0;
  }
  Status fail(Status status);

  const int side_;
  const int peerSide_;
  const std::string name_;
  const std::string secret_;
  Segment segment_;
  const int peerPid_;
  net::Fd peerProcess_;  // pidfd; readable once the peer process has exited
  const CmaAbility selfCanRead_;
  CmaAbility peerCanRead_ = CmaAbility::kUnknown;
  const uint64_t cmaMinBytes_;
  const Deadline attachDeadline_;
  const std::string peer_;
  bool attached_ = false;
  std::vector<uint8_t> staged_;  // a reducing receive that came by single copy

  uint8_t* outRing_ = nullptr;
  const uint8_t* inRing_ = nullptr;
  Control* outControl_ = nullptr;  // counters of the ring this side writes
  Control* inControl_ = nullptr;   // ... and of the one it reads
  uint64_t slotMask_ = 0;
  uint64_t maxFrameBytes_ = 0;
  uint64_t sentSlots_ = 0;      // slots this side has filled (absolute)
  uint64_t sentFrames_ = 0;
  uint64_t peerConsumed_ = 0;   // cached Control::consumedSlots of the out ring
  uint64_t cmaSent_ = 0;
  uint64_t readSlots_ = 0;      // slots of the in ring this side has consumed
  uint64_t readFrames_ = 0;
  uint64_t cmaRead_ = 0;

  RingQueue<SendOp> sends_;
  std::vector<Completion> writtenAtPost_;  // sends postSend wrote; the next poll() reports them
  RingQueue<CmaWait> cmaWaits_;
  RingQueue<RecvOp> recvs_;
  int64_t nextPeerCheckNs_ = 0;
  uint32_t idlePolls_ = 0;
  Status failure_;
};

}  // namespace shoal::shm
