// TcpConnection: one ordered, tag-checked pipe to one peer over 1..64 TCP
// sockets ("lanes"), both directions.
//
// Role: the data path of the tcp transport (README.md has the wire format).
// Owner: the Communicator that asked TcpTransport::connect for it.
// Thread: used only by the engine, by whichever thread pumps it, one at a time
// (transport.h); no locks, except around the failure reports, which the
// communicator's failing thread writes and reads. Nothing here blocks: post*
// queue work, poll() moves bytes with non-blocking readv/writev on the lanes
// that have work (tracked in bit masks, so an idle connection costs no
// syscall). The one wait: a poll that meets a closing peer's bye reads the
// report after it for at most 20 ms, once, as the connection fails.
//
// Striping: message n of B bytes goes out as `slices` segments; slice j lives
// on lane (n + j) % lanes and covers a contiguous run of whole chunks
// (chunkBytes each). Both sides compute the same plan (planSlice) from (n, B,
// lanes, chunkBytes): the receiver from the size of its posted receive, which
// each segment header then confirms. Small messages (B <= chunkBytes) are one
// segment, and consecutive messages rotate over the lanes.
//
// Receiving: a lane reads only bytes that belong to receives already posted
// (headers, small payloads through a 64 KiB staging buffer in one read;
// payloads of 8 KiB and more straight into the user buffer), so the next
// unposted message stays in the kernel. Every segment header is checked
// (tag, bytes, message number, slice) before its payload touches user memory.
//
// Memory: the queues are rings that grow by doubling and are reused, so the
// steady-state data path allocates nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/ring_queue.h"
#include "net/fd.h"
#include "transports/transport.h"

namespace shoal::tcp {

inline constexpr int kMaxLanes = 64;
inline constexpr size_t kSegmentHeaderBytes = 24;

// Which lane carries which bytes of a message (pure; both sides agree).
struct SlicePlan {
  int lane = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
int sliceCount(uint64_t bytes, int lanes, uint64_t chunkBytes);
SlicePlan planSlice(uint64_t seq, uint64_t bytes, int lanes, uint64_t chunkBytes, int slice);

template <typename T>
using Ring = RingQueue<T>;

class TcpConnection final : public Connection {
 public:
  // `lanes` are connected, non-blocking sockets in the same order on both
  // sides; chunkBytes is the connector's (both sides must use the same).
  TcpConnection(std::vector<net::Fd> lanes, uint64_t chunkBytes, std::string peerDescription);
  ~TcpConnection() override;

  Status postSend(const void* data, uint64_t bytes, uint64_t tag, uint64_t token) override;
  Status postRecv(void* data, uint64_t bytes, uint64_t tag, uint64_t token) override;
  Status poll(std::vector<Completion>& done, bool& progressed) override;
  size_t pending() const override { return activeSends_ + activeRecvs_; }
  // Every socket: EOF, a pending error, or silence past net::silentAfterMs
  // (net::checkIdleSocket); nothing is read or written.
  Status checkAlive() override;
  // A job ended without its operations here (failed, aborted): the
  // connection fails for good, so that no later poll (another job's) moves
  // their bytes into or out of buffers their owner has been told are done.
  void quiesce() override { (void)fail(quiescedError(peer_)); }
  const std::string& peerDescription() const override { return peer_; }
  // Failure reports travel with the bye: this rank's goes out when the
  // connection is destroyed (a failing communicator closes its connections),
  // the peer's is read with its bye by the operation that meets it. Nothing
  // reads the sockets after this side's operations have failed, so a report
  // is never worth waiting for here.
  bool carriesFailureReports() const override { return true; }
  bool failureReportsArriveUnread() const override { return false; }
  // What the bye carries is all the peer had to say: it sends it as it
  // closes, after its final report (peerFailureFinal stays true).
  void publishFailure(std::string_view reason, bool final) override;
  std::string peerFailure() const override;

  // The longest report a bye carries: longer ones keep their start (this
  // rank's view) and their end (where a chain of reports names the first
  // cause).
  static constexpr size_t kMaxReportBytes = 16 << 10;
  static std::string boundReport(std::string_view report);

  int laneCount() const { return static_cast<int>(lanes_.size()); }

 private:
  struct Op {
    uint64_t token = 0;
    uint64_t bytes = 0;
    uint32_t segmentsLeft = 0;
  };
  struct SendSegment {
    uint8_t header[kSegmentHeaderBytes];
    const uint8_t* data = nullptr;
    uint64_t length = 0;
    uint64_t sent = 0;  // of header + payload
    uint64_t seq = 0;
  };
  struct RecvSegment {
    uint64_t tag = 0;
    uint64_t messageBytes = 0;
    uint64_t seq = 0;
    uint16_t slice = 0;
    uint16_t slices = 0;
    uint8_t* data = nullptr;
    uint64_t length = 0;
    uint64_t have = 0;
    bool headerDone = false;
  };
  struct Lane {
    net::Fd fd;
    Ring<SendSegment> sends;
    Ring<RecvSegment> recvs;
    std::unique_ptr<uint8_t[]> stage;  // staged bytes of posted segments
    size_t stageStart = 0;
    size_t stageEnd = 0;
  };

  Status pumpSends(int index, bool& moved, std::vector<Completion>& done);
  Status pumpRecvs(int index, bool& moved, std::vector<Completion>& done);
  struct StageRead {
    size_t bytes = 0;        // 0: nothing available (or nothing wanted)
    bool shortRead = false;  // fewer bytes than asked: the kernel has no more now
  };
  // Reads into the lane's staging buffer no more than posted segments need.
  Result<StageRead> fillStage(Lane& lane);
  Status checkHeader(const Lane& lane, const RecvSegment& segment, int index) const;
  // The lane's next header is a bye: reads the report that follows it
  // (staged or still in the socket; what arrives within 20 ms) for
  // peerFailure(), and says the peer has gone (before `segment`, if any).
  Status byeStatus(Lane& lane, const RecvSegment* segment);
  // After a send failed: a bye waiting where a lane's next header is, as
  // byeStatus says it; ok if there is none.
  Status findBye();
  void finishSegment(Ring<Op>& ops, uint64_t& base, size_t& active, uint64_t seq,
                     std::vector<Completion>& done);
  Status fail(Status status);

  std::vector<Lane> lanes_;
  const uint64_t chunkBytes_;
  const std::string peer_;
  const int64_t silentMs_;  // checkAlive: a socket this long without a word from the peer's host is dead
  uint64_t sendMask_ = 0;  // lanes with queued send segments
  uint64_t recvMask_ = 0;  // lanes with posted receive segments
  Ring<Op> sendOps_;
  Ring<Op> recvOps_;
  uint64_t sendBase_ = 0;  // message number of sendOps_.front()
  uint64_t recvBase_ = 0;
  uint64_t nextSendSeq_ = 0;
  uint64_t nextRecvSeq_ = 0;
  size_t activeSends_ = 0;
  size_t activeRecvs_ = 0;
  Status failure_;
  mutable std::mutex reportMutex_;  // guards the two reports
  std::string ownReport_;           // sent with the bye
  std::string peerReport_;          // read with the peer's bye
};

}  // namespace shoal::tcp
