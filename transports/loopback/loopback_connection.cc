#include "transports/loopback/loopback_connection.h"

#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include "core/tag.h"

namespace shoal {

namespace {

// The stream of the process's loopback GPU copies in `context` (current on
// the calling thread), made at the first: each copy is waited for at once,
// so a stream per pipe would buy nothing but hardware queues to share. Kept
// for the process, as the primary contexts it is made in are. Its own
// stream, not the legacy default one: a user stream there may be waiting
// for this very operation.
// Keyed by the context's instance (Driver::currentContextInstance): a reset
// context comes back at the same handle without its streams.
Result<cuda::StreamHandle> copyStreamOf(cuda::Driver& driver) {
  SHOAL_ASSIGN_OR_RETURN(uint64_t context, driver.currentContextInstance());
  static std::mutex mutex;
  static auto* streams = new std::map<uint64_t, cuda::StreamHandle>();  // never freed
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = streams->find(context); it != streams->end()) return it->second;
  SHOAL_ASSIGN_OR_RETURN(cuda::StreamHandle stream, driver.createStream());
  streams->emplace(context, stream);
  return stream;
}

}  // namespace

LoopbackPipe::LoopbackPipe(const LoopbackFaults& f, cuda::Driver* driver)
    : faults(f), stallRng(f.reorderSeed), driver_(driver) {}

LoopbackPipe::~LoopbackPipe() { freeRing(); }

void LoopbackPipe::freeRing() {
  if (!ring_.words) return;
  cuda::ContextScope scope(*driver_, ring_.context);
  if (!scope.entered()) return;  // never free memory a stream may still use
  if (ring_.fifo) (void)driver_->deviceFree(ring_.fifo);
  driver_->hostFree(ring_.words);
  ring_ = RingMemory{};
}

Status LoopbackPipe::makeRing(cuda::ContextHandle context, uint64_t bytesPerDirection) {
  if (driver_ == nullptr) return internalError("loopback: a stream ring without CUDA");
  RingMemory ring;
  ring.context = context;
  ring.slots = kRingSlots;
  ring.slotBytes = (bytesPerDirection / kRingSlots + 4095) / 4096 * 4096;
  SHOAL_ASSIGN_OR_RETURN(void* fifo, driver_->deviceAlloc(2 * ring.slots * ring.slotBytes),
                         "loopback: the stream ring's FIFOs");
  ring.fifo = static_cast<uint8_t*>(fifo);
  Result<void*> words = driver_->hostAlloc(sizeof(StreamRingWords));
  if (!words.isOk()) {
    (void)driver_->deviceFree(fifo);
    return StatusBuilder(words.takeStatus()) << "loopback: the stream ring's words";
  }
  ring.words = new (words.value()) StreamRingWords();
  ring_ = ring;
  return Status::ok();
}

Status LoopbackPipe::copyMessage(void* dst, const void* src, uint64_t bytes) {
  if (driver_ != nullptr) {
    SHOAL_ASSIGN_OR_RETURN(cuda::Driver::Place to, driver_->placeOf(dst), "loopback: the receive buffer");
    SHOAL_ASSIGN_OR_RETURN(cuda::Driver::Place from, driver_->placeOf(src), "loopback: the send buffer");
    if (to.kind == cuda::MemoryKind::kDevice || from.kind == cuda::MemoryKind::kDevice) {
      // On the device that holds the receive buffer, else the send buffer;
      // unified addressing takes the other side wherever it is.
      const int device = to.kind == cuda::MemoryKind::kDevice ? to.device : from.device;
      SHOAL_ASSIGN_OR_RETURN(cuda::ContextHandle context, driver_->primaryContextOfDevice(device),
                             "loopback: the context of device ", device);
      return copyOnGpu(context, dst, src, bytes);
    }
  }
  std::memcpy(dst, src, bytes);
  return Status::ok();
}

Status LoopbackPipe::copyOnGpu(cuda::ContextHandle context, void* dst, const void* src, uint64_t bytes) {
  cuda::ContextScope scope(*driver_, context);
  SHOAL_TRY(scope.status()) << "loopback: a GPU copy";
  Result<cuda::StreamHandle> stream = copyStreamOf(*driver_);  // `context` is current
  Status st = stream.status();
  if (st.isOk()) st = driver_->copyAsync(dst, src, bytes, stream.value());
  if (st.isOk()) st = driver_->synchronize(stream.value());
  if (!st.isOk()) return StatusBuilder(std::move(st)) << "loopback: a GPU copy of " << bytes << " bytes";
  return Status::ok();
}

LoopbackConnection::LoopbackConnection(std::shared_ptr<LoopbackPipe> pipe, int side, int sendDir,
                                       int recvDir, std::string peerDescription)
    : pipe_(std::move(pipe)),
      side_(side),
      sendDir_(sendDir),
      recvDir_(recvDir),
      peerDescription_(std::move(peerDescription)) {}

void LoopbackPipe::fail(const Status& status) {
  std::lock_guard<std::mutex> lock(mutex);
  if (failure.isOk()) failure = status;
  if (ring_.words) ring_.words->broken.store(1, std::memory_order_release);
}

Status LoopbackPipe::failed() {
  std::lock_guard<std::mutex> lock(mutex);
  return failure;
}

Status LoopbackConnection::attachRing(cuda::Driver& driver, cuda::ContextHandle context) {
  const LoopbackPipe::RingMemory* memory = pipe_->ring();
  if (memory == nullptr) return internalError("loopback: the pipe to ", peerDescription_, " has no stream ring");
  StreamRing::Setup setup;
  setup.side = side_;
  setup.words = memory->words;
  for (int lane = 0; lane < 2; ++lane) setup.fifo[lane] = memory->fifo + lane * memory->slots * memory->slotBytes;
  setup.slots = memory->slots;
  setup.slotBytes = memory->slotBytes;
  setup.peerDescription = peerDescription_;
  SHOAL_ASSIGN_OR_RETURN(ring_, StreamRing::make(driver, std::move(setup)), "loopback to ", peerDescription_);
  ringContext_ = context;
  return Status::ok();
}

LoopbackConnection::~LoopbackConnection() {
  bool used = used_;
  // Only whole messages sent on the ring, which its streams have published
  // (the communicator settles them first): they wait for the peer in the
  // ring, as a message in a receiver's FIFO does.
  bool onlyRingSends = false;
  if (ring_) {
    const StreamLink::Progress p = ring_->progress();
    onlyRingSends = !used_ && p.recvEnqueued == 0 && p.sendEnqueued > 0 && ring_->usable().isOk();
    used = used || p.sendEnqueued > 0 || p.recvEnqueued > 0;
    // Its header log is pinned memory of the ring's context; a stream that
    // may still write it keeps it (never freed under a stream).
    cuda::Driver* driver = cuda::Driver::inUse();
    cuda::ContextScope scope(driver, ringContext_);
    if (scope.entered()) ring_.reset();
    else (void)ring_.release();
  }
  bool forget = false;
  {
    std::lock_guard<std::mutex> lock(pipe_->mutex);
    pipe_->closed[side_] = true;
    // Our queued sends point into buffers that may die with us: drop them.
    pipe_->directions[sendDir_].sends.clear();
    pipe_->directions[recvDir_].recvs.clear();
    if (sendDir_ != recvDir_ && !pipe_->attached[1 - side_]) {
      // The peer has not come yet; our streams have passed the ring (the
      // communicator settles them first). A pipe this end never used goes.
      // One that holds only messages this end sent on the ring stays as it
      // is, for the peer to take them (its communicator forgets it if it
      // never comes: LoopbackTransport::forgetRank). One it used otherwise
      // (or that failed) stays failed and without its memory, so that a
      // late peer fails at once instead of waiting alone for its deadline.
      if (pipe_->failure.isOk() && !used) {
        forget = true;
      } else if (pipe_->failure.isOk() && onlyRingSends) {
        // kept whole: the peer's connect finds it
      } else {
        if (pipe_->failure.isOk())
          pipe_->failure = remoteError("the loopback pipe to ", peerDescription_, " was closed by the other end "
                                       "before this end connected (its communicator destroyed or aborted)");
        pipe_->freeRing();
      }
    }
  }
  if (forget && pipe_->forget) pipe_->forget();  // the transport's lock, not the pipe's
}

Status LoopbackConnection::postSend(const void* data, uint64_t bytes, uint64_t tag,
                                    uint64_t token) {
  std::lock_guard<std::mutex> lock(pipe_->mutex);
  if (!pipe_->failure.isOk()) return pipe_->failure;
  const LoopbackFaults& f = pipe_->faults;
  int64_t n = ++pipe_->messagesPosted;
  if (f.failNth > 0 && n == f.failNth) {
    pipe_->failure = remoteError(peerDescription_, ": injected failure at message ", n);
    return pipe_->failure;
  }
  used_ = true;
  int64_t readyAt = f.delayUs > 0 ? nowNs() + f.delayUs * 1000 : 0;
  bool blackhole = f.blackholeNth > 0 && n == f.blackholeNth;
  pipe_->directions[sendDir_].sends.push_back({data, bytes, tag, token, readyAt, blackhole});
  ++pending_;
  return Status::ok();
}

Status LoopbackConnection::postRecv(void* data, uint64_t bytes, uint64_t tag, uint64_t token) {
  std::lock_guard<std::mutex> lock(pipe_->mutex);
  if (!pipe_->failure.isOk()) return pipe_->failure;
  used_ = true;
  pipe_->directions[recvDir_].recvs.push_back({data, bytes, tag, token});
  ++pending_;
  return Status::ok();
}

// Matches queued sends with posted receives of one direction, in order.
Status LoopbackConnection::deliver(LoopbackPipe::Direction& dir, bool& progressed) {
  LoopbackPipe& pipe = *pipe_;
  if (pipe.faults.reorderSeed != 0 && (pipe.stallRng() & 3) == 0) return Status::ok();
  while (!dir.sends.empty() && !dir.recvs.empty()) {
    const auto& s = dir.sends.front();
    const auto& r = dir.recvs.front();
    if (s.blackhole) break;
    if (s.readyAtNs != 0 && nowNs() < s.readyAtNs) break;
    if (s.tag != r.tag || s.bytes != r.bytes) {
      pipe.failure = invalidUsage(
          "collective mismatch on the loopback pipe: the receiver expected ", describeTag(r.tag),
          " of ", r.bytes, " bytes, the sender sent ", describeTag(s.tag), " of ", s.bytes,
          " bytes (ranks called different operations or different counts)");
      return pipe.failure;
    }
    if (s.bytes > 0 && s.data != r.data) {
      if (Status copied = pipe.copyMessage(r.data, s.data, s.bytes); !copied.isOk()) {
        pipe.failure = copied;
        return pipe.failure;
      }
    }
    dir.senderDone.push_back({s.token, s.bytes});
    dir.receiverDone.push_back({r.token, r.bytes});
    dir.sends.pop_front();
    dir.recvs.pop_front();
    progressed = true;
  }
  return Status::ok();
}

void LoopbackConnection::quiesce() {
  std::lock_guard<std::mutex> lock(pipe_->mutex);
  LoopbackPipe& pipe = *pipe_;
  if (pipe.failure.isOk())
    pipe.failure = remoteError("the loopback pipe to ", peerDescription_, " was closed by the other end: its "
                               "operation ended without its messages (it failed or was aborted)");
  if (const LoopbackPipe::RingMemory* ring = pipe.ring()) ring->words->broken.store(1, std::memory_order_release);
  if (ring_) ring_->markFailed();
  pipe.directions[sendDir_].sends.clear();
  pipe.directions[recvDir_].recvs.clear();
  pipe.directions[sendDir_].senderDone.clear();
  pipe.directions[recvDir_].receiverDone.clear();
  pending_ = 0;
}

Status LoopbackConnection::checkAlive() {
  if (sendDir_ == recvDir_) return Status::ok();  // to oneself
  std::lock_guard<std::mutex> lock(pipe_->mutex);
  if (!pipe_->closed[1 - side_]) return Status::ok();
  bool owed = pending_ > 0;
  if (ring_) {
    const StreamLink::Progress p = ring_->progress();
    owed = owed || p.sent < p.sendEnqueued || p.received < p.recvEnqueued;
  }
  if (!owed) return Status::ok();
  return remoteError(peerDescription_, " closed its end of the loopback connection (communicator destroyed or "
                     "aborted) while operations here still wait for it");
}

Status LoopbackConnection::poll(std::vector<Completion>& done, bool& progressed) {
  std::lock_guard<std::mutex> lock(pipe_->mutex);
  LoopbackPipe& pipe = *pipe_;
  if (pipe.failure.isOk()) {
    Status s = deliver(pipe.directions[sendDir_], progressed);
    if (s.isOk() && recvDir_ != sendDir_) s = deliver(pipe.directions[recvDir_], progressed);
  }
  auto take = [&](std::vector<Completion>& from) {
    for (const auto& c : from) done.push_back(c);
    pending_ -= from.size();
    from.clear();
  };
  take(pipe.directions[sendDir_].senderDone);
  take(pipe.directions[recvDir_].receiverDone);
  if (!pipe.failure.isOk()) {
    if (ring_) ring_->markFailed();
    // Everything this end posted has completed (the peer's job may have
    // failed after it matched them): the failure is its next post's.
    if (pending_ == 0) return Status::ok();
    Status s = pipe.failure;
    return s.withContext(peerDescription_);
  }
  int peerSide = 1 - side_;
  if (sendDir_ != recvDir_ && pipe.closed[peerSide] && pending_ > 0)
    return remoteError(peerDescription_, ": connection closed by peer");
  return Status::ok();
}

}  // namespace shoal
