#include "transports/cuda_ipc/cuda_ipc_connection.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "core/tag.h"

namespace shoal::cuda_ipc {
namespace {

// A liveness look every this many polls that moved nothing while work is
// pending: a recv() on the socket costs about a microsecond.
constexpr uint32_t kIdlePollsPerLook = 64;

}  // namespace

CudaIpcConnection::CudaIpcConnection(ConnectionSetup setup) : setup_(std::move(setup)) {
  out_ = &setup_.control->lanes[setup_.side];
  in_ = &setup_.control->lanes[1 - setup_.side];
}

Result<std::unique_ptr<CudaIpcConnection>> CudaIpcConnection::make(ConnectionSetup setup) {
  cuda::Driver* driver = cuda::Driver::inUse();
  if (driver == nullptr) return error(Code::kInternalError, "cuda_ipc without a CUDA driver");
  std::unique_ptr<CudaIpcConnection> c(new CudaIpcConnection(std::move(setup)));
  cuda::ContextScope scope(*driver, c->setup_.context);
  SHOAL_TRY(scope.status()) << "cuda_ipc connection to " << c->setup_.peerDescription;
  SHOAL_ASSIGN_OR_RETURN(c->sendStream_, driver->createStream(), "cuda_ipc connection to ",
                         c->setup_.peerDescription);
  SHOAL_ASSIGN_OR_RETURN(c->recvStream_, driver->createStream(), "cuda_ipc connection to ",
                         c->setup_.peerDescription);
  if (c->setup_.streamRing) {
    StreamRing::Setup ring;
    ring.side = c->setup_.side;
    ring.words = &c->setup_.control->streamWords;
    for (int lane = 0; lane < 2; ++lane) ring.fifo[lane] = c->slotAddress(2 + lane, 0);
    ring.slots = c->setup_.slots;
    ring.slotBytes = c->setup_.slotBytes;
    ring.peerDescription = c->setup_.peerDescription;
    SHOAL_ASSIGN_OR_RETURN(c->ring_, StreamRing::make(*driver, std::move(ring)), "cuda_ipc");
  }
  for (uint32_t i = 0; i < c->setup_.slots; ++i) {
    SHOAL_ASSIGN_OR_RETURN(cuda::EventHandle send, driver->createEvent(), "cuda_ipc events");
    c->sendEvents_.push_back(send);
    SHOAL_ASSIGN_OR_RETURN(cuda::EventHandle recv, driver->createEvent(), "cuda_ipc events");
    c->recvEvents_.push_back(recv);
  }
  return c;
}

CudaIpcConnection::~CudaIpcConnection() {
  if (setup_.control) setup_.control->closed[setup_.side].store(1, std::memory_order_release);
  cuda::Driver* driver = cuda::Driver::inUse();
  if (driver != nullptr) {
    cuda::ContextScope scope(*driver, setup_.context);
    if (scope.entered()) {
      // Copies still queued read or write the FIFO and the posted buffers.
      if (sendStream_) (void)driver->synchronize(sendStream_);
      if (recvStream_) (void)driver->synchronize(recvStream_);
      for (auto e : sendEvents_) driver->destroyEvent(e);
      for (auto e : recvEvents_) driver->destroyEvent(e);
      driver->destroyStream(sendStream_);
      driver->destroyStream(recvStream_);
      // The peer's mapping keeps the memory until it unmaps it too.
      if (setup_.fifo) (void)driver->deviceFree(setup_.fifo);
      ring_.reset();
    } else {
      (void)ring_.release();  // a stream may still write its header log: never freed under it
    }
    if (setup_.streamRing) driver->unregisterHost(setup_.control);
  }
  if (setup_.control) ::munmap(setup_.control, controlBytes());
}

uint8_t* CudaIpcConnection::slotAddress(int lane, uint64_t chunk) const {
  uint64_t slot = chunk % setup_.slots;
  return static_cast<uint8_t*>(setup_.fifo) + (static_cast<uint64_t>(lane) * setup_.slots + slot) * setup_.slotBytes;
}

Status CudaIpcConnection::postSend(const void* data, uint64_t bytes, uint64_t tag, uint64_t token) {
  if (!failed_.isOk()) return failed_;
  sends_.push_back(Op{static_cast<uint8_t*>(const_cast<void*>(data)), bytes, tag, token});
  return Status::ok();
}

Status CudaIpcConnection::postRecv(void* data, uint64_t bytes, uint64_t tag, uint64_t token) {
  if (!failed_.isOk()) return failed_;
  recvs_.push_back(Op{static_cast<uint8_t*>(data), bytes, tag, token});
  return Status::ok();
}

Status CudaIpcConnection::fail(Status status) {
  if (!failed_.isOk()) return failed_;
  failed_ = std::move(status);
  if (ring_) ring_->markFailed();
  // No copy of this connection may touch a posted buffer once it has
  // reported an error: the caller's job ends, and its buffers may be freed.
  // (A stream is synchronized in its own context, whichever is current.)
  if (cuda::Driver* driver = cuda::Driver::inUse()) {
    cuda::ContextScope scope(*driver, setup_.context);
    (void)driver->synchronize(sendStream_);
    (void)driver->synchronize(recvStream_);
  }
  sendCopies_.clear();
  recvCopies_.clear();
  return failed_;
}

// Copies chunks of the queued sends into free slots of the peer-bound lane.
Status CudaIpcConnection::issueSends(bool& progressed) {
  cuda::Driver& driver = *cuda::Driver::inUse();
  while (!sends_.empty()) {
    if (sendIssued_ - peerConsumed_ >= setup_.slots) {
      peerConsumed_ = out_->consumed.load(std::memory_order_acquire);
      if (sendIssued_ - peerConsumed_ >= setup_.slots) break;
    }
    Op& op = sends_.front();
    uint64_t chunk = std::min<uint64_t>(setup_.slotBytes, op.bytes - op.offset);
    uint32_t slot = static_cast<uint32_t>(sendIssued_ % setup_.slots);
    out_->slots[slot] = SlotHeader{op.tag, op.bytes, chunk, 0};
    Copy copy{slot, chunk > 0, op.offset + chunk == op.bytes, op.token, op.bytes};
    if (chunk > 0) {
      SHOAL_TRY(driver.copyAsync(slotAddress(setup_.side, sendIssued_), op.data + op.offset, chunk, sendStream_))
          << "cuda_ipc send to " << setup_.peerDescription;
      SHOAL_TRY(driver.recordEvent(sendEvents_[slot], sendStream_)) << "cuda_ipc send";
    }
    sendCopies_.push_back(copy);
    ++sendIssued_;
    op.offset += chunk;
    op.started = true;
    progressed = true;
    if (op.offset == op.bytes) sends_.pop_front();
  }
  return Status::ok();
}

// Retires, in order, the chunks whose copies have completed: the sender
// publishes them, the receiver hands their slots back; the last chunk of a
// message completes it.
Status CudaIpcConnection::retire(std::deque<Copy>& copies, const std::vector<cuda::EventHandle>& events,
                                 std::atomic<uint64_t>& counter, uint64_t& count, std::vector<Completion>& done,
                                 bool& progressed) {
  cuda::Driver& driver = *cuda::Driver::inUse();
  while (!copies.empty()) {
    const Copy& copy = copies.front();
    if (copy.hasEvent) {
      SHOAL_ASSIGN_OR_RETURN(bool finished, driver.eventDone(events[copy.slot]), "cuda_ipc copy with ",
                             setup_.peerDescription);
      if (!finished) break;
    }
    counter.store(++count, std::memory_order_release);
    if (copy.lastOfMessage) done.push_back(Completion{copy.token, copy.messageBytes});
    copies.pop_front();
    progressed = true;
  }
  return Status::ok();
}

// Copies published chunks out of the incoming lane into the posted receives.
Status CudaIpcConnection::issueRecvs(bool& progressed) {
  cuda::Driver& driver = *cuda::Driver::inUse();
  while (!recvs_.empty() && recvIssued_ < in_->published.load(std::memory_order_acquire)) {
    Op& op = recvs_.front();
    uint32_t slot = static_cast<uint32_t>(recvIssued_ % setup_.slots);
    const SlotHeader header = in_->slots[slot];
    if (!op.started && (header.tag != op.tag || header.messageBytes != op.bytes))
      return invalidUsage(setup_.peerDescription, ": message mismatch: the posted receive expects ",
                          describeTag(op.tag), ", ", op.bytes, " bytes; the peer sent ", describeTag(header.tag),
                          ", ", header.messageBytes, " bytes (ranks called different operations or counts)");
    if (header.chunkBytes > setup_.slotBytes || header.chunkBytes > op.bytes - op.offset ||
        (header.chunkBytes == 0 && op.bytes != 0))
      return remoteError(setup_.peerDescription, ": corrupt cuda_ipc slot (chunk of ", header.chunkBytes,
                         " bytes at offset ", op.offset, " of a ", op.bytes, "-byte message)");
    uint64_t chunk = header.chunkBytes;
    Copy copy{slot, chunk > 0, op.offset + chunk == op.bytes, op.token, op.bytes};
    if (chunk > 0) {
      SHOAL_TRY(driver.copyAsync(op.data + op.offset, slotAddress(1 - setup_.side, recvIssued_), chunk, recvStream_))
          << "cuda_ipc receive from " << setup_.peerDescription;
      SHOAL_TRY(driver.recordEvent(recvEvents_[slot], recvStream_)) << "cuda_ipc receive";
    }
    recvCopies_.push_back(copy);
    ++recvIssued_;
    op.offset += chunk;
    op.started = true;
    progressed = true;
    if (op.offset == op.bytes) recvs_.pop_front();
  }
  return Status::ok();
}

Status CudaIpcConnection::poll(std::vector<Completion>& done, bool& progressed) {
  if (!failed_.isOk()) return failed_;
  if (pending() == 0) return Status::ok();
  cuda::Driver* driver = cuda::Driver::inUse();
  if (driver == nullptr) return fail(internalError("cuda_ipc: the CUDA driver is gone"));
  bool moved = false;
  {
    cuda::ContextScope scope(*driver, setup_.context);
    if (!scope.status().isOk()) return fail(scope.status());
    Status s = retire(sendCopies_, sendEvents_, out_->published, sendPublished_, done, moved);
    if (s.isOk()) s = retire(recvCopies_, recvEvents_, in_->consumed, recvConsumed_, done, moved);
    if (s.isOk()) s = issueSends(moved);
    if (s.isOk()) s = issueRecvs(moved);
    if (!s.isOk()) return fail(std::move(s));
  }
  if (moved) {
    progressed = true;
    idlePolls_ = 0;
    return Status::ok();
  }
  // Only a connection that waits on its peer asks whether it is there: a
  // peer that published its last chunk may destroy its end or exit while our
  // copies of that chunk still run (its memory stays mapped here).
  if (++idlePolls_ % kIdlePollsPerLook == 0 && waitsOnPeer()) {
    Status alive = lookAtPeer(/*idle=*/false);
    if (!alive.isOk()) return fail(std::move(alive));
  }
  return Status::ok();
}

bool CudaIpcConnection::waitsOnPeer() const {
  if (!sendCopies_.empty() || !recvCopies_.empty()) return false;  // our own copies are running
  bool sendBlocked = !sends_.empty() && sendIssued_ - out_->consumed.load(std::memory_order_acquire) >= setup_.slots;
  bool recvStarved = !recvs_.empty() && recvIssued_ >= in_->published.load(std::memory_order_acquire);
  return sendBlocked || recvStarved;
}

bool CudaIpcConnection::mightProgress() const {
  if (!sendCopies_.empty() || !recvCopies_.empty()) return true;  // copies the GPU may have finished
  if (!recvs_.empty() && recvIssued_ < in_->published.load(std::memory_order_acquire)) return true;
  if (!sends_.empty() && sendIssued_ - out_->consumed.load(std::memory_order_acquire) < setup_.slots) return true;
  return idlePolls_ % kIdlePollsPerLook == kIdlePollsPerLook - 1;  // the liveness look is due
}

Status CudaIpcConnection::lookAtPeer(bool idle) {
  // A peer that closed its end on purpose (destroyed or aborted its
  // communicator) left; it did not die: the idle check stays quiet unless
  // something here still waits for it (an operation posted here, or a
  // stream plan's messages on the ring, which posts none), and an operation
  // that needs it fails.
  if (setup_.control->closed[1 - setup_.side].load(std::memory_order_acquire)) {
    bool ringOwed = false;
    if (ring_) {
      const StreamLink::Progress p = ring_->progress();
      ringOwed = p.sent < p.sendEnqueued || p.received < p.recvEnqueued;
    }
    if (idle && pending() == 0 && !ringOwed) return Status::ok();
    return remoteError(setup_.peerDescription, " closed its end of the cuda_ipc connection (communicator "
                       "destroyed or aborted) with ", pending(), " operations pending here",
                       ringOwed ? " and stream plan messages still owed on its stream ring" : "");
  }
  char byte = 0;
  ssize_t got = ::recv(setup_.socket.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (got == 0)
    return remoteError(setup_.peerDescription, ": its cuda_ipc socket closed while ",
                       idle ? "the connection was idle" : "operations were pending",
                       " (the peer process exited, killed or crashed, or its communicator ended before it "
                       "connected)");
  if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
    return remoteError(setup_.peerDescription, ": cuda_ipc socket: ", std::strerror(errno));
  return Status::ok();
}

Status CudaIpcConnection::checkAlive() {
  if (!failed_.isOk()) return failed_;
  Status alive = lookAtPeer(/*idle=*/true);
  return alive.isOk() ? alive : fail(std::move(alive));
}

}  // namespace shoal::cuda_ipc
