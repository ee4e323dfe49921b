#include "transports/stream_ring/stream_ring.h"

#include <algorithm>

#include "core/tag.h"

namespace shoal {

Result<std::unique_ptr<StreamRing>> StreamRing::make(cuda::Driver& driver, Setup setup) {
  if (setup.words == nullptr || setup.fifo[0] == nullptr || setup.fifo[1] == nullptr || setup.slots == 0 ||
      setup.slots > kStreamRingMaxSlots || setup.slotBytes == 0 || (setup.side != 0 && setup.side != 1))
    return internalError("stream ring to ", setup.peerDescription, ": malformed setup");
  std::unique_ptr<StreamRing> ring(new StreamRing(driver, std::move(setup)));
  SHOAL_ASSIGN_OR_RETURN(void* log, driver.hostAlloc((kHeaderLog * 2 + 1) * sizeof(uint64_t)),
                         "the stream ring's header log");
  ring->headerLog_ = static_cast<uint64_t*>(log);
  *ring->headersLogged() = 0;
  return ring;
}

StreamRing::~StreamRing() { driver_.hostFree(headerLog_); }

Status StreamRing::usable() const {
  if (setup_.words->broken.load(std::memory_order_acquire))
    return remoteError(setup_.peerDescription, ": the stream ring is broken (an operation on it failed, on this rank "
                       "or the peer; see the first error)");
  if (connectionFailed_.load(std::memory_order_acquire))
    return remoteError(setup_.peerDescription, ": the connection has failed");
  return Status::ok();
}

// A chunk's wait, copy and word write are enqueued on the caller's stream
// in that order, so the word is written once the copy is done (a stream
// memory write follows the stream's earlier work).
Status StreamRing::enqueueSend(const void* src, uint64_t bytes, uint64_t tag, void* stream) {
  SHOAL_TRY(usable());
  StreamRingLane& lane = setup_.words->lanes[setup_.side];
  const auto* from = static_cast<const uint8_t*>(src);
  uint64_t chunk = sendEnqueued_.load(std::memory_order_relaxed);
  for (uint64_t offset = 0; offset < bytes; offset += setup_.slotBytes, ++chunk) {
    const uint64_t n = std::min<uint64_t>(setup_.slotBytes, bytes - offset);
    // Slot chunk % slots is free once the peer has copied out chunk - slots.
    if (chunk >= setup_.slots) {
      SHOAL_TRY(driver_.waitValueAsync(&lane.consumed, chunk - setup_.slots + 1, stream));
    }
    if (offset == 0) {
      uint64_t* header = lane.headers[chunk % setup_.slots];
      SHOAL_TRY(driver_.writeValueAsync(&header[0], tag, stream));
      SHOAL_TRY(driver_.writeValueAsync(&header[1], bytes, stream));
    }
    SHOAL_TRY(driver_.copyAsync(slotAddress(setup_.side, chunk), from + offset, n, stream));
    SHOAL_TRY(driver_.writeValueAsync(&lane.published, chunk + 1, stream));
    // Counted per chunk enqueued whole (a failed call leaves the ring to release()).
    sendEnqueued_.store(chunk + 1, std::memory_order_release);
  }
  return Status::ok();
}

Status StreamRing::enqueueRecv(void* dst, uint64_t bytes, uint64_t tag, void* stream) {
  SHOAL_TRY(usable());
  if (bytes == 0) return Status::ok();
  StreamRingLane& lane = setup_.words->lanes[1 - setup_.side];
  auto* to = static_cast<uint8_t*>(dst);
  uint64_t chunk = recvEnqueued_.load(std::memory_order_relaxed);
  const uint64_t message = recvMessages_++;
  {
    std::lock_guard<std::mutex> lock(expectedMutex_);
    expected_.push_back(Expected{message, tag, bytes});
  }
  for (uint64_t offset = 0; offset < bytes; offset += setup_.slotBytes, ++chunk) {
    const uint64_t n = std::min<uint64_t>(setup_.slotBytes, bytes - offset);
    SHOAL_TRY(driver_.waitValueAsync(&lane.published, chunk + 1, stream));
    if (offset == 0) {
      SHOAL_TRY(driver_.copyAsync(headerLog_ + 2 * (message % kHeaderLog), lane.headers[chunk % setup_.slots],
                                  2 * sizeof(uint64_t), stream));
      SHOAL_TRY(driver_.writeValueAsync(headersLogged(), message + 1, stream));
    }
    SHOAL_TRY(driver_.copyAsync(to + offset, slotAddress(1 - setup_.side, chunk), n, stream));
    SHOAL_TRY(driver_.writeValueAsync(&lane.consumed, chunk + 1, stream));
    recvEnqueued_.store(chunk + 1, std::memory_order_release);
  }
  return Status::ok();
}

StreamLink::Progress StreamRing::progress() const {
  const StreamRingLane& out = setup_.words->lanes[setup_.side];
  const StreamRingLane& in = setup_.words->lanes[1 - setup_.side];
  Progress p;
  p.sendEnqueued = sendEnqueued_.load(std::memory_order_acquire);
  p.sent = __atomic_load_n(&out.consumed, __ATOMIC_ACQUIRE);
  p.recvEnqueued = recvEnqueued_.load(std::memory_order_acquire);
  p.received = __atomic_load_n(&in.published, __ATOMIC_ACQUIRE);
  return p;
}

Status StreamRing::verify() {
  if (setup_.words->broken.load(std::memory_order_acquire)) return usable();
  std::lock_guard<std::mutex> lock(expectedMutex_);
  while (!expected_.empty()) {
    const Expected& e = expected_.front();
    // The header is in the log once the stream has counted it (it writes
    // the count after the copy); entry m is reused by message m + kHeaderLog,
    // whose copy may start once the count has reached that: read between two
    // looks at the count, and a read that may have met that copy is not
    // checked (no false alarm).
    const uint64_t* logged = headersLogged();
    if (static_cast<int64_t>(__atomic_load_n(logged, __ATOMIC_ACQUIRE) - (e.message + 1)) < 0) break;
    const uint64_t* header = headerLog_ + 2 * (e.message % kHeaderLog);
    const uint64_t tag = __atomic_load_n(&header[0], __ATOMIC_ACQUIRE);
    const uint64_t bytes = __atomic_load_n(&header[1], __ATOMIC_ACQUIRE);
    const bool overwritten =
        static_cast<int64_t>(__atomic_load_n(logged, __ATOMIC_ACQUIRE) - (e.message + kHeaderLog)) >= 0;
    if (!overwritten && (tag != e.tag || bytes != e.bytes))
      return invalidUsage(setup_.peerDescription, ": message mismatch on the stream ring: the receive expects ",
                          describeTag(e.tag), ", ", e.bytes, " bytes; the peer sent ", describeTag(tag), ", ",
                          bytes, " bytes (ranks called different operations or counts)");
    expected_.pop_front();
  }
  return Status::ok();
}

void StreamRing::release() {
  // For good, for both sides: the peer's plans on this ring fail (verify)
  // and release their side; nothing more is enqueued on it.
  setup_.words->broken.store(1, std::memory_order_release);
  // Far past every chunk enqueued (the waits compare cyclically): the words
  // this side's streams wait on, which only the peer writes otherwise (and
  // may write again while its streams run: the caller releases again until
  // ours have passed).
  constexpr uint64_t kReleased = 1ull << 40;
  StreamRingLane& out = setup_.words->lanes[setup_.side];
  StreamRingLane& in = setup_.words->lanes[1 - setup_.side];
  __atomic_store_n(&out.consumed, sendEnqueued_.load() + kReleased, __ATOMIC_RELEASE);
  __atomic_store_n(&in.published, recvEnqueued_.load() + kReleased, __ATOMIC_RELEASE);
}

}  // namespace shoal
