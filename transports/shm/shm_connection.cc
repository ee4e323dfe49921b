#include "transports/shm/shm_connection.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <utility>

#include "core/log.h"
#include "core/process.h"
#include "core/tag.h"
#include "reduce/reduce.h"

namespace shoal::shm {
namespace {

enum FrameKind : uint32_t { kInline = 0, kSingleCopy = 1 };

// The first 32 bytes of a frame's first slot; the payload follows it (a
// kSingleCopy frame's is the address of the message in the sender's memory).
struct FrameHeader {
  std::atomic<uint64_t> stamp;  // frame number + 1; stored last
  uint64_t tag;
  uint64_t messageBytes;
  uint32_t frameBytes;          // payload bytes in this frame
  uint32_t kind;
};
constexpr size_t kFrameHeaderBytes = sizeof(FrameHeader);
static_assert(kFrameHeaderBytes == 32);
static_assert(offsetof(FrameHeader, stamp) == 0);  // frameArrived reads it as a slot's first word

constexpr int64_t kPeerCheckIntervalNs = 10'000'000;
// Bytes one poll() copies by process_vm_readv before returning, so other
// connections and steps of the same job keep moving during a huge message.
constexpr uint64_t kSingleCopyBytesPerPoll = 4ull << 20;
// Sends up to this size are written by postSend when nothing is queued ahead
// (latency-bound messages; larger ones are written by poll(), as before).
constexpr uint64_t kWriteAtPostBytes = 4096;

uint64_t slotsFor(uint64_t frameBytes) { return (kFrameHeaderBytes + frameBytes + kSlotBytes - 1) / kSlotBytes; }

int pidfdOpen(int pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

}  // namespace

ShmConnection::ShmConnection(ConnectionSetup setup)
    : side_(setup.side),
      peerSide_(1 - setup.side),
      name_(std::move(setup.segmentName)),
      secret_(std::move(setup.secret)),
      segment_(std::move(setup.segment)),
      peerPid_(setup.peerPid),
      peerProcess_(pidfdOpen(setup.peerPid)),
      selfCanRead_(setup.selfCanRead),
      cmaMinBytes_(setup.cmaMinBytes),
      attachDeadline_(setup.attachDeadline),
      peer_(std::move(setup.peerDescription)) {}

ShmConnection::~ShmConnection() {
  if (segment_.mapped()) segment_.header().closed[side_].store(1, std::memory_order_release);
}

Status ShmConnection::fail(Status status) {
  failure_ = std::move(status);
  if (segment_.mapped()) segment_.header().closed[side_].store(1, std::memory_order_release);
  return failure_;
}

// Append-only: the peer may be reading the published bytes, so they are
// never rewritten; a report that extends the published one (what this rank
// learned from its own upstream since) adds its tail, any other keeps the
// first.
void ShmConnection::publishFailure(std::string_view reason, bool final) {
  if (!segment_.mapped()) return;
  Header& h = segment_.header();
  const size_t published = h.reasonLength[side_].load(std::memory_order_relaxed);  // this side writes it
  const size_t n = std::min(reason.size(), kReasonBytes);
  if (n > published && std::string_view(h.reason[side_], published) == reason.substr(0, published)) {
    std::memcpy(h.reason[side_] + published, reason.data() + published, n - published);
    h.reasonLength[side_].store(static_cast<uint32_t>(n), std::memory_order_release);
  }
  if (final) h.reasonFinal[side_].store(1, std::memory_order_release);
}

bool ShmConnection::peerFailureFinal() const {
  return segment_.mapped() && segment_.header().reasonFinal[peerSide_].load(std::memory_order_acquire) != 0;
}

bool ShmConnection::failureReportsArriveUnread() const {
  if (!segment_.mapped()) return false;
  return side_ == 1 || segment_.header().openerPid.load(std::memory_order_acquire) != 0;
}

std::string ShmConnection::peerFailure() const {
  if (!segment_.mapped()) return {};
  const Header& h = segment_.header();
  uint32_t n = h.reasonLength[peerSide_].load(std::memory_order_acquire);
  return std::string(h.reason[peerSide_], std::min<size_t>(n, kReasonBytes));
}

Status ShmConnection::postSend(const void* data, uint64_t bytes, uint64_t tag, uint64_t token) {
  bool finished = false;
  SHOAL_TRY(postSendOrFinish(data, bytes, tag, token, finished));
  if (finished) writtenAtPost_.push_back({token, bytes});  // reported by the next poll()
  return Status::ok();
}

Status ShmConnection::postSendOrFinish(const void* data, uint64_t bytes, uint64_t tag, uint64_t token,
                                       bool& finished) {
  finished = false;
  if (!failure_.isOk()) return failure_;
  sends_.push_back() = SendOp{static_cast<const uint8_t*>(data), bytes, tag, token, 0};
  // A small send with nothing queued ahead of it goes into the ring now: the
  // peer may already wait for it, and the engine posts this job's other steps
  // (and starts its poll) before it would otherwise be written.
  if (attached_ && sends_.size() == 1 && bytes <= kWriteAtPostBytes) {
    bool moved = false;
    if (Status s = pumpSends(writtenAtPost_, moved); !s.isOk()) return fail(std::move(s));
    if (sends_.empty() && !singleCopySend(bytes, 0)) {  // written whole: the last completion added
      writtenAtPost_.pop_back();
      finished = true;
    }
  }
  return Status::ok();
}

Status ShmConnection::postRecv(void* data, uint64_t bytes, uint64_t tag, uint64_t token) {
  if (!failure_.isOk()) return failure_;
  recvs_.push_back() = RecvOp{static_cast<uint8_t*>(data), bytes, tag, token, 0};
  return Status::ok();
}

Status ShmConnection::postRecvReduce(const ReduceOnReceive& r, uint64_t bytes, uint64_t tag, uint64_t token) {
  if (!failure_.isOk()) return failure_;
  recvs_.push_back() = RecvOp{nullptr, bytes, tag, token, 0, /*reduces=*/true, r};
  return Status::ok();
}

void ShmConnection::deliver(const RecvOp& op, uint64_t at, const uint8_t* from, uint64_t n) {
  if (!op.reduces) {
    std::memcpy(op.data + at, from, n);
    return;
  }
  // Frames end on 32-byte boundaries of the message (ring slots are 64 bytes,
  // a header 32) and single copies arrive whole: whole elements every time.
  const ReduceOnReceive& r = op.reduce;
  const uint8_t* other = r.other + at;
  reduce::combine(r.op, r.dtype, r.dst + at, r.receivedFirst ? from : other, r.receivedFirst ? other : from,
                  n / dataTypeSize(r.dtype), r.scalar);
}

Status ShmConnection::attach() {
  if (side_ == 1 && !segment_.mapped()) {
    SHOAL_ASSIGN_OR_RETURN(segment_, Segment::tryOpen(name_, secret_), "attaching to ", peer_);
    if (!segment_.mapped()) return checkPeer(/*attaching=*/true);
    Header& h = segment_.header();
    h.canRead[1].store(static_cast<int32_t>(selfCanRead_), std::memory_order_relaxed);
    h.openerPid.store(currentPid(), std::memory_order_release);
  }
  Header& h = segment_.header();
  if (side_ == 0) {
    if (h.openerPid.load(std::memory_order_acquire) == 0) return checkPeer(/*attaching=*/true);
    segment_.unlinkName();  // the opener has it mapped (and unlinked it)
  }
  peerCanRead_ = static_cast<CmaAbility>(h.canRead[peerSide_].load(std::memory_order_acquire));
  outRing_ = segment_.ring(side_);
  inRing_ = segment_.ring(peerSide_);
  outControl_ = &segment_.control(side_);
  inControl_ = &segment_.control(peerSide_);
  slotMask_ = segment_.ringBytes() / kSlotBytes - 1;
  maxFrameBytes_ = segment_.ringBytes() / 4 - kFrameHeaderBytes;
  attached_ = true;
  SHOAL_INFO(subsys::kShm, "shm connection to ", peer_, " ready: ", segment_.ringBytes() >> 10,
             " KiB rings, single copy to peer ", peerCanRead_ == CmaAbility::kYes ? "on" : "off",
             ", from peer ", selfCanRead_ == CmaAbility::kYes ? "on" : "off");
  return Status::ok();
}

Status ShmConnection::poll(std::vector<Completion>& done, bool& progressed) {
  if (!failure_.isOk()) return failure_;
  bool moved = false;
  if (!attached_) {
    if (Status s = attach(); !s.isOk()) return fail(std::move(s));
    if (!attached_) return Status::ok();
  }
  if (!writtenAtPost_.empty()) {
    done.insert(done.end(), writtenAtPost_.begin(), writtenAtPost_.end());
    writtenAtPost_.clear();
    progressed = true;
  }
  // The pass a waiting rank repeats: nothing to write, nothing arrived. Kept
  // short, since a frame that lands mid-pass is seen only at the next one.
  if (!hasWork()) {
    if (recvs_.empty() || !peerCheckDue()) return Status::ok();
    if (Status s = checkPeer(/*attaching=*/false); !s.isOk()) return fail(std::move(s));
    return Status::ok();
  }
  // Sends first: a receive's look at the peer's ring can miss in the cache
  // (the peer is writing there), and stores after a missing load in program
  // order become visible only once the load completes: receiving first held
  // our frame back by one transfer between the cores, more the more lines it
  // had (2 ranks, distant vCPUs: AllReduce 256 B 0.98 -> 0.64 us).
  if (Status s = pumpSends(done, moved); !s.isOk()) return fail(std::move(s));
  if (Status s = pumpRecvs(done, moved); !s.isOk()) return fail(std::move(s));
  if (moved) {
    progressed = true;
  } else if (pending() > 0 && peerCheckDue()) {
    if (Status s = checkPeer(/*attaching=*/false); !s.isOk()) return fail(std::move(s));
  }
  return Status::ok();
}

uint64_t ShmConnection::freeSlots() {
  uint64_t capacity = slotMask_ + 1;
  return capacity - (sentSlots_ - peerConsumed_);
}

Status ShmConnection::pumpSends(std::vector<Completion>& done, bool& progressed) {
  Control& control = *outControl_;
  // Single-copy sends finish when the receiver says it has read them.
  if (!cmaWaits_.empty()) {
    uint64_t reads = control.cmaReads.load(std::memory_order_acquire);
    while (!cmaWaits_.empty() && cmaWaits_.front().index < reads) {
      done.push_back({cmaWaits_.front().token, cmaWaits_.front().bytes});
      cmaWaits_.pop_front();
      progressed = true;
    }
  }
  const uint64_t capacity = slotMask_ + 1;
  while (!sends_.empty()) {
    SendOp& op = sends_.front();
    bool singleCopy = singleCopySend(op.bytes, op.offset);
    uint64_t address = reinterpret_cast<uint64_t>(op.data);
    uint64_t frameBytes = singleCopy ? sizeof(address) : std::min(op.bytes - op.offset, maxFrameBytes_);
    uint64_t slots = slotsFor(frameBytes);
    if (freeSlots() < slots) {
      peerConsumed_ = control.consumedSlots.load(std::memory_order_acquire);
      if (freeSlots() < slots) break;
    }
    uint64_t first = sentSlots_ & slotMask_;
    auto* header = reinterpret_cast<FrameHeader*>(outRing_ + first * kSlotBytes);
    header->tag = op.tag;
    header->messageBytes = op.bytes;
    header->frameBytes = static_cast<uint32_t>(frameBytes);
    header->kind = singleCopy ? kSingleCopy : kInline;
    if (frameBytes > 0) {
      // The payload runs on from the header, wrapping at the end of the ring.
      const uint8_t* payload = singleCopy ? reinterpret_cast<const uint8_t*>(&address) : op.data + op.offset;
      uint64_t start = first * kSlotBytes + kFrameHeaderBytes;
      uint64_t ringBytes = capacity * kSlotBytes;
      uint64_t head = std::min(frameBytes, ringBytes - start);
      std::memcpy(outRing_ + start, payload, head);
      if (head < frameBytes) std::memcpy(outRing_, payload + head, frameBytes - head);
    }
    header->stamp.store(++sentFrames_, std::memory_order_release);
    sentSlots_ += slots;
    progressed = true;
    if (singleCopy) {
      cmaWaits_.push_back() = CmaWait{op.token, op.bytes, cmaSent_++};
      sends_.pop_front();
      continue;
    }
    op.offset += frameBytes;
    if (op.offset == op.bytes) {
      done.push_back({op.token, op.bytes});
      sends_.pop_front();
    }
  }
  return Status::ok();
}

Status ShmConnection::readSingleCopy(RecvOp& op, uint8_t* into, uint64_t address, bool& finished) {
  uint64_t budget = kSingleCopyBytesPerPoll;
  while (op.offset < op.bytes && budget > 0) {
    uint64_t want = std::min(op.bytes - op.offset, budget);
    iovec local{into + op.offset, want};
    iovec remote{reinterpret_cast<void*>(address + op.offset), want};
    ssize_t got = process_vm_readv(peerPid_, &local, 1, &remote, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      if (err == ESRCH) return remoteError(peer_, ": the peer process ", peerPid_, " has exited");
      return errnoStatus(err, "process_vm_readv from " + peer_);
    }
    if (got == 0) return systemError("process_vm_readv from ", peer_, " read nothing");
    op.offset += static_cast<uint64_t>(got);
    budget -= std::min<uint64_t>(budget, static_cast<uint64_t>(got));
  }
  finished = op.offset == op.bytes;
  return Status::ok();
}

Status ShmConnection::pumpRecvs(std::vector<Completion>& done, bool& progressed) {
  Control& control = *inControl_;
  const uint64_t capacity = slotMask_ + 1;
  while (!recvs_.empty()) {
    if (!frameArrived()) break;
    uint64_t first = readSlots_ & slotMask_;
    auto* header = reinterpret_cast<const FrameHeader*>(inRing_ + first * kSlotBytes);
    RecvOp& op = recvs_.front();
    if (header->tag != op.tag || header->messageBytes != op.bytes)
      return invalidUsage(peer_, ": message mismatch: the posted receive expects ", describeTag(op.tag), ", ",
                          op.bytes, " bytes; the peer sent ", describeTag(header->tag), ", ",
                          header->messageBytes, " bytes (ranks called different operations or counts)");
    uint64_t slots = 1;
    if (header->kind == kSingleCopy) {
      if (op.offset == 0 && op.bytes > 0) progressed = true;
      bool finished = false;
      uint64_t address = 0;  // in the first slot (a header is 32 bytes)
      std::memcpy(&address, inRing_ + first * kSlotBytes + kFrameHeaderBytes, sizeof(address));
      // A reducing receive sent by single copy (the peer's threshold differs
      // from ours) is read whole into staging, then reduced.
      if (op.reduces) staged_.resize(op.bytes);
      SHOAL_TRY(readSingleCopy(op, op.reduces ? staged_.data() : op.data, address, finished));
      progressed = true;
      if (!finished) break;  // more in the next poll
      if (op.reduces) deliver(op, 0, staged_.data(), op.bytes);
      control.cmaReads.store(++cmaRead_, std::memory_order_release);
    } else {
      uint64_t frameBytes = header->frameBytes;
      if (frameBytes > op.bytes - op.offset || frameBytes > maxFrameBytes_)
        return systemError(peer_, ": corrupt shm frame of ", frameBytes, " bytes for a receive with ",
                           op.bytes - op.offset, " bytes left");
      uint64_t start = first * kSlotBytes + kFrameHeaderBytes;
      uint64_t ringBytes = capacity * kSlotBytes;
      uint64_t head = std::min(frameBytes, ringBytes - start);
      if (frameBytes > 0) {
        deliver(op, op.offset, inRing_ + start, head);
        if (head < frameBytes) deliver(op, op.offset + head, inRing_, frameBytes - head);
      }
      op.offset += frameBytes;
      slots = slotsFor(frameBytes);
    }
    readSlots_ += slots;
    ++readFrames_;
    control.consumedSlots.store(readSlots_, std::memory_order_release);
    progressed = true;
    if (op.offset == op.bytes) {
      done.push_back({op.token, op.bytes});
      recvs_.pop_front();
    }
  }
  return Status::ok();
}

Status ShmConnection::checkAlive() {
  if (!failure_.isOk()) return failure_;
  // A peer that closed its end on purpose, saying nothing of a failure,
  // destroyed or aborted its communicator: it left (its process may exit
  // next), it did not die. An operation on this connection fails
  // (checkPeer); the idle check stays quiet.
  if (segment_.mapped() && segment_.header().closed[peerSide_].load(std::memory_order_acquire) &&
      peerFailure().empty())
    return Status::ok();
  nextPeerCheckNs_ = 0;  // look at the process now
  if (Status s = checkPeer(/*attaching=*/false); !s.isOk()) return fail(std::move(s));
  // The peer's communicator failed (e.g. its own idle check lost a third
  // rank) and said why in the segment: ours cannot run either.
  if (std::string why = peerFailure(); !why.empty())
    return fail(remoteError(peer_, " reported a failure while this connection was idle: ", why));
  return Status::ok();
}

Status ShmConnection::checkPeer(bool attaching) {
  if (segment_.mapped() && segment_.header().closed[peerSide_].load(std::memory_order_acquire)) {
    std::string why = peerFailure();
    return remoteError(peer_, " closed its end of the shared-memory connection (communicator destroyed or "
                       "failed) with ", pending(), " operations pending here",
                       why.empty() ? std::string() : "; it reported: " + why);
  }
  int64_t now = nowNs();
  if (now >= nextPeerCheckNs_) {
    nextPeerCheckNs_ = now + kPeerCheckIntervalNs;
    bool gone = false;
    if (peerProcess_.valid()) {
      pollfd p{peerProcess_.get(), POLLIN, 0};
      gone = ::poll(&p, 1, 0) > 0;
    } else {
      gone = kill(peerPid_, 0) != 0 && errno == ESRCH;
    }
    if (gone) {
      // A process that failed before it exited may have said why.
      std::string why = peerFailure();
      return remoteError(peer_, ": the peer process ", peerPid_, " has exited (killed, crashed, or ended after "
                         "its communicator was destroyed) while ",
                         attaching         ? "this rank waited for it to attach"
                         : pending() > 0   ? "operations were pending"
                                           : "the connection was idle",
                         why.empty() ? std::string() : "; it had reported: " + why);
    }
  }
  if (attaching && attachDeadline_.expired())
    return remoteError(peer_, " did not attach to the shared-memory segment ", name_,
                       attachDeadline_.cancelled()
                           ? ": the wait was ended (the communicator was aborted, or the peer is known to have failed)"
                           : " before the connection deadline (SHOAL_INIT_TIMEOUT_MS)");
  return Status::ok();
}

}  // namespace shoal::shm
