#include "comm/stream_bridge.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "collectives/layout.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/params.h"
#include "transports/registry.h"

namespace shoal {
namespace {

uint64_t alignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }


// SHOAL_CUDA_STAGING_BYTES, never negative.
uint64_t stagingLimit() { return static_cast<uint64_t>(std::max<int64_t>(params().cudaStagingBytes, 0)); }

// Captured operations' memory whose bridge ended before their graph did:
// freed by whichever bridge reclaims next once the graph is gone (the
// graph's user object cannot free it: no CUDA call is allowed there).
struct OrphanedCapture {
  uint8_t* memory;
  uint8_t* staging;
  uint64_t stagingBytes;
  std::shared_ptr<const std::atomic<bool>> graphGone;
  cuda::ContextHandle context;  // where it was allocated, and that context's instance
  uint64_t instance;
};
std::mutex gOrphansMutex;
std::vector<OrphanedCapture>* gOrphans = nullptr;  // never destroyed: a graph may outlive statics
std::atomic<size_t> gOrphanCount{0};

void freeOrphans(cuda::Driver& driver) {
  if (gOrphanCount.load(std::memory_order_acquire) == 0) return;
  std::lock_guard<std::mutex> lock(gOrphansMutex);
  std::erase_if(*gOrphans, [&](const OrphanedCapture& o) {
    if (!o.graphGone->load(std::memory_order_acquire)) return false;
    forgetMemory(o.staging, o.stagingBytes);
    // A context destroyed or reset since took its memory with it: the
    // address may be another allocation's now.
    if (driver.contextStillThere(o.context, o.instance)) driver.hostFree(o.memory);
    return true;
  });
  gOrphanCount.store(gOrphans->size(), std::memory_order_release);
}

}  // namespace

StreamBridge::StreamBridge(cuda::Driver& driver, cuda::DeviceIdentity device)
    : driver_(driver), device_(device) {
  // Every kernel resolved now, on the calling thread with the device's
  // context current: a kernel loaded lazily during a collective can deadlock.
  Result<const cuda::DeviceReducer*> reducer = cuda::DeviceReducer::forCurrentContext(driver_);
  if (reducer.isOk()) reducer_ = reducer.value();
}

StreamBridge::~StreamBridge() {
  // A stream may still copy out of a slot or write its words (the engine
  // released it, but the stream runs behind): what it has not passed is
  // left allocated rather than freed under it (the owner waits first:
  // Communicator's teardown, comm/deferred_release.h).
  if (!passed()) {
    SHOAL_WARN("CUDA: a stream has not passed this communicator's staged operations; their "
               "pinned staging is left allocated");
    return;
  }
  for (const auto& slot : slots_) {
    if (!slot->captured) {
      freeStaging(*slot);
    } else if (slot->memory != nullptr && slot->graphGone->load(std::memory_order_acquire)) {
      freeCaptured(*slot);
    } else if (slot->memory != nullptr) {
      // Its graph may still be launched: the memory outlives this bridge.
      const Result<cuda::ContextHandle> context = driver_.currentContext();
      const Result<uint64_t> instance = driver_.currentContextInstance();
      std::lock_guard<std::mutex> lock(gOrphansMutex);
      if (gOrphans == nullptr) gOrphans = new std::vector<OrphanedCapture>;
      gOrphans->push_back({slot->memory, slot->staging, slot->stagingBytes, slot->graphGone,
                           context.isOk() ? context.value() : nullptr, instance.isOk() ? instance.value() : 0});
      gOrphanCount.store(gOrphans->size(), std::memory_order_release);
    }
  }
  for (uint64_t* page : doorbellPages_) driver_.hostFree(page);
  freeOrphans(driver_);
}

void StreamBridge::freeStaging(Slot& slot) {
  if (slot.staging == nullptr) return;
  forgetMemory(slot.staging, slot.stagingBytes);  // a transport may hold a registration of it
  driver_.hostFree(slot.staging);
  slot.staging = nullptr;
  slot.stagingBytes = 0;
}

bool StreamBridge::passed() const {
  for (const auto& slot : slots_)
    if (!slot->captured && slot->busy && !streamWordReached(slot->words + kReleased, slot->seq)) return false;
  return true;
}

void StreamBridge::freeCaptured(Slot& slot) {
  if (slot.memory == nullptr) return;
  forgetMemory(slot.staging, slot.stagingBytes);
  driver_.hostFree(slot.memory);
  slot.memory = slot.staging = nullptr;
  slot.words = nullptr;
  slot.stagingBytes = 0;
  slot.busy = false;
  slot.graphGone.reset();
}

Result<bool> StreamBridge::streamOrdered(const OpRequest& op, int rank, int nranks) {
  const OpLayout layout = opLayout(op.shape, rank, nranks);
  struct Use {
    const void* ptr;
    const char* name;
  } uses[3] = {{layout.sendBytes ? op.sendbuff : nullptr, "sendbuff"},
               {layout.recvBytes ? op.recvbuff : nullptr, "recvbuff"},
               {op.scalar.deviceScalar, "the PreMulSum scalar"}};
  const char* hostName = nullptr;
  const char* cudaName = nullptr;
  cuda::MemoryKind cudaKind = cuda::MemoryKind::kHost;
  for (const Use& use : uses) {
    if (use.ptr == nullptr) continue;
    SHOAL_ASSIGN_OR_RETURN(cuda::MemoryKind kind, driver_.memoryKind(use.ptr), use.name);
    if (cuda::knownToCuda(kind)) {
      if (!cudaName) {
        cudaName = use.name;
        cudaKind = kind;
      }
    } else if (!hostName && use.ptr != op.scalar.deviceScalar) {
      hostName = use.name;
    }
  }
  if (cudaName && hostName)
    return invalidArgument(cudaName, " is ", cuda::memoryKindName(cudaKind), " memory but ",
                           hostName, " is pageable host memory: one operation cannot mix them "
                           "(use device buffers, or host buffers with a NULL stream)");
  return cudaName != nullptr;
}

Status StreamBridge::newDoorbellPage() {
  SHOAL_ASSIGN_OR_RETURN(void* page, driver_.hostAlloc(kSlotsPerPage * kWordsPerSlot * sizeof(uint64_t)),
                         "CUDA: pinned words for stream-ordered operations");
  auto* words = static_cast<uint64_t*>(page);
  std::fill(words, words + kSlotsPerPage * kWordsPerSlot, 0);
  doorbellPages_.push_back(words);
  for (uint64_t i = 0; i < kSlotsPerPage; ++i) freeWords_.push_back(words + i * kWordsPerSlot);
  return Status::ok();
}

void StreamBridge::reclaim(bool mayFree) {
  for (auto& slot : slots_) {
    if (slot->captured) {
      if (mayFree && slot->memory != nullptr && slot->graphGone->load(std::memory_order_acquire))
        freeCaptured(*slot);
      continue;
    }
    if (slot->busy && streamWordReached(slot->words + kReleased, slot->seq)) slot->busy = false;
  }
  if (!mayFree) return;
  freeOrphans(driver_);
  // Keep at most the parameter's worth of idle staging, the largest first to
  // go (captured operations' staging is their graphs').
  uint64_t kept = 0;
  for (const auto& slot : slots_)
    if (!slot->captured) kept += slot->stagingBytes;
  const uint64_t limit = stagingLimit();
  while (kept > limit) {
    Slot* largest = nullptr;
    for (auto& slot : slots_)
      if (!slot->busy && !slot->captured && slot->stagingBytes > 0 &&
          (!largest || slot->stagingBytes > largest->stagingBytes))
        largest = slot.get();
    if (!largest) break;
    kept -= largest->stagingBytes;
    freeStaging(*largest);
  }
}

void StreamBridge::throttle(uint64_t stagingBytes) {
  // Staging held by operations still on their streams, and what this one
  // needs, stay within the bound: wait for earlier operations to leave their
  // slots (their streams and the engine move on without this thread). The
  // wait is bounded, so a stream held back by later work of this thread (an
  // event it has yet to record) costs time, not a hang: after it the
  // staging goes over the bound, said once at INFO.
  const uint64_t limit = stagingLimit();
  auto busyBytes = [&] {
    uint64_t bytes = 0;
    for (const auto& slot : slots_)
      if (slot->busy && !slot->captured) bytes += slot->stagingBytes;  // a graph's is not coming back
    return bytes;
  };
  if (busyBytes() == 0 || busyBytes() + stagingBytes <= limit) return;
  Deadline deadline = Deadline::afterMs(kThrottleMs);
  Backoff backoff;
  while (true) {
    reclaim();
    const uint64_t busy = busyBytes();
    if (busy == 0 || busy + stagingBytes <= limit) return;
    if (deadline.expired()) {
      if (!overBoundLogged_) {
        overBoundLogged_ = true;
        SHOAL_INFO(subsys::kAlloc, "CUDA: operations still on their streams hold ", busy,
                   " bytes of staging; this one adds ", stagingBytes, ", over SHOAL_CUDA_STAGING_BYTES=",
                   limit, " (the streams are more than ", kThrottleMs, " ms behind)");
      }
      return;
    }
    backoff.pause();
  }
}

Result<size_t> StreamBridge::takeCapturedSlot(uint64_t stagingBytes,
                                              std::shared_ptr<const std::atomic<bool>> graphGone) {
  reclaim(/*mayFree=*/false);  // the caller's stream is being captured
  size_t index = slots_.size();
  for (size_t i = 0; i < slots_.size() && index == slots_.size(); ++i)
    if (slots_[i]->captured && slots_[i]->memory == nullptr) index = i;  // an empty one
  if (index == slots_.size()) {
    auto slot = std::make_unique<Slot>();
    slot->captured = true;
    slots_.push_back(std::move(slot));
  }
  Slot& slot = *slots_[index];
  SHOAL_ASSIGN_OR_RETURN(void* memory, driver_.hostAlloc(kCapturedWordsBytes + stagingBytes),
                         "CUDA: ", stagingBytes, " bytes of pinned staging for a captured operation");
  slot.memory = static_cast<uint8_t*>(memory);
  slot.words = reinterpret_cast<uint64_t*>(slot.memory);
  std::fill(slot.words, slot.words + kWordsPerSlot, 0);
  slot.staging = slot.memory + kCapturedWordsBytes;
  slot.stagingBytes = stagingBytes;
  slot.graphGone = std::move(graphGone);
  rememberMemory(slot.staging, stagingBytes);
  return index;
}

Result<size_t> StreamBridge::takeSlot(uint64_t stagingBytes) {
  throttle(stagingBytes);
  reclaim();
  // The idle slot whose staging fits best; else the idle slot with the most.
  size_t best = slots_.size();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = *slots_[i];
    if (s.busy || s.captured) continue;
    if (best == slots_.size()) {
      best = i;
      continue;
    }
    const Slot& b = *slots_[best];
    bool fits = s.stagingBytes >= stagingBytes, bestFits = b.stagingBytes >= stagingBytes;
    if ((fits && (!bestFits || s.stagingBytes < b.stagingBytes)) ||
        (!fits && !bestFits && s.stagingBytes > b.stagingBytes))
      best = i;
  }
  if (best == slots_.size()) {
    if (freeWords_.empty()) {
      SHOAL_TRY(newDoorbellPage());
    }
    auto slot = std::make_unique<Slot>();
    slot->words = freeWords_.back();
    freeWords_.pop_back();
    slots_.push_back(std::move(slot));
  }
  Slot& slot = *slots_[best];
  if (slot.stagingBytes < stagingBytes) {
    freeStaging(slot);
    SHOAL_ASSIGN_OR_RETURN(void* staging, driver_.hostAlloc(stagingBytes),
                           "CUDA: ", stagingBytes, " bytes of pinned staging");
    slot.staging = static_cast<uint8_t*>(staging);
    slot.stagingBytes = stagingBytes;
    rememberMemory(staging, stagingBytes);  // freeStaging says when it ends
  }
  return best;
}

std::vector<StreamBridge::Placement> StreamBridge::layOut(std::span<const OpRequest> ops, int rank, int nranks,
                                                         bool direct, uint64_t& total) const {
  std::vector<Placement> placements(ops.size());
  total = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    if (direct) continue;  // nothing staged, nothing copied
    const OpRequest& op = ops[k];
    const OpLayout layout = opLayout(op.shape, rank, nranks);
    Placement& p = placements[k];
    p.sendBytes = op.sendbuff ? layout.sendBytes : 0;
    p.recvBytes = op.recvbuff ? layout.recvBytes : 0;
    p.outBegin = std::min(layout.outputBegin, p.recvBytes);
    p.outEnd = std::min(layout.outputEnd, p.recvBytes);
    const auto send = reinterpret_cast<uintptr_t>(op.sendbuff);
    const auto recv = reinterpret_cast<uintptr_t>(op.recvbuff);
    if (p.sendBytes && p.recvBytes && send < recv + p.recvBytes && recv < send + p.sendBytes) {
      // Overlapping (in place): one staged range over both, same offsets.
      const uintptr_t begin = std::min(send, recv);
      const uintptr_t end = std::max(send + p.sendBytes, recv + p.recvBytes);
      p.sendOffset = total + (send - begin);
      p.recvOffset = total + (recv - begin);
      total = alignUp(total + (end - begin), kAlign);
    } else {
      p.sendOffset = total;
      total = alignUp(total + p.sendBytes, kAlign);
      p.recvOffset = total;
      total = alignUp(total + p.recvBytes, kAlign);
    }
    if (op.scalar.deviceScalar) {
      p.stagedScalar = true;
      p.scalarOffset = total;
      total = alignUp(total + sizeof(op.scalar.bytes), kAlign);
    }
  }
  total = std::max<uint64_t>(total, kAlign);
  return placements;
}

Result<StreamBridge::Staged> StreamBridge::stage(std::span<const OpRequest> ops, int rank, int nranks,
                                                  bool direct) {
  uint64_t total = 0;
  std::vector<Placement> placements = layOut(ops, rank, nranks, direct, total);
  SHOAL_ASSIGN_OR_RETURN(size_t index, takeSlot(total));
  return handOut(index, std::move(placements), ops, direct);
}

Result<StreamBridge::Staged> StreamBridge::stageCaptured(std::span<const OpRequest> ops, int rank, int nranks,
                                                          std::shared_ptr<const std::atomic<bool>> graphGone,
                                                          bool direct) {
  uint64_t total = 0;
  std::vector<Placement> placements = layOut(ops, rank, nranks, direct, total);
  SHOAL_ASSIGN_OR_RETURN(size_t index, takeCapturedSlot(total, std::move(graphGone)));
  return handOut(index, std::move(placements), ops, direct);
}

StreamBridge::Staged StreamBridge::handOut(size_t index, std::vector<Placement> placements,
                                           std::span<const OpRequest> ops, bool direct) {
  Slot& slot = *slots_[index];
  slot.busy = true;
  slot.seq = nextSeq_++;
  slot.placements = std::move(placements);
  Staged staged;
  staged.slot = index;
  staged.seq = slot.seq;
  staged.ready = slot.words + kReady;
  staged.done = slot.words + kDone;
  staged.ops.assign(ops.begin(), ops.end());
  for (size_t k = 0; k < ops.size(); ++k) {
    const Placement& p = slot.placements[k];
    OpRequest& op = staged.ops[k];
    op.streamOrdered = false;  // the engine runs it: on staging, or on device buffers (direct)
    if (direct) continue;
    // A buffer this rank does not use stays null (non-roots of rooted calls).
    op.sendbuff = p.sendBytes ? slot.staging + p.sendOffset : nullptr;
    op.recvbuff = p.recvBytes ? slot.staging + p.recvOffset : nullptr;
    if (p.stagedScalar) op.scalar.deviceScalar = slot.staging + p.scalarOffset;
  }
  return staged;
}

Status StreamBridge::copyInputs(const Slot& slot, std::span<const OpRequest> ops,
                                cuda::StreamHandle stream, bool async) {
  for (size_t k = 0; k < ops.size(); ++k) {
    const Placement& p = slot.placements[k];
    const OpRequest& op = ops[k];
    auto copy = [&](void* dst, const void* src, size_t bytes) {
      return async ? driver_.copyAsync(dst, src, bytes, stream) : driver_.copy(dst, src, bytes);
    };
    if (p.sendBytes) {
      SHOAL_TRY(copy(slot.staging + p.sendOffset, op.sendbuff, p.sendBytes)) << "staging sendbuff";
    }
    if (p.stagedScalar) {
      SHOAL_TRY(copy(slot.staging + p.scalarOffset, op.scalar.deviceScalar,
                     dataTypeSize(op.shape.dtype))) << "staging the PreMulSum scalar";
    }
  }
  return Status::ok();
}

Status StreamBridge::copyOutputs(const Slot& slot, std::span<const OpRequest> ops,
                                 cuda::StreamHandle stream, bool async) {
  for (size_t k = 0; k < ops.size(); ++k) {
    const Placement& p = slot.placements[k];
    if (p.outEnd <= p.outBegin) continue;
    auto* dst = static_cast<uint8_t*>(ops[k].recvbuff) + p.outBegin;
    const uint8_t* src = slot.staging + p.recvOffset + p.outBegin;
    size_t bytes = p.outEnd - p.outBegin;
    SHOAL_TRY(async ? driver_.copyAsync(dst, src, bytes, stream) : driver_.copy(dst, src, bytes))
        << "copying recvbuff back";
  }
  return Status::ok();
}

Status StreamBridge::enqueue(const Staged& staged, std::span<const OpRequest> ops) {
  Slot& slot = *slots_[staged.slot];
  const cuda::WaitMode mode = waitMode();
  slot.words[kSeqSource] = staged.seq;
  const std::vector<cuda::StreamHandle> streams = Communicator::streamsOf(ops);
  cuda::StreamHandle lead = streams[0];
  std::vector<cuda::EventHandle> events;
  auto destroyEvents = [&] {
    for (cuda::EventHandle e : events) driver_.destroyEvent(e);  // freed once their work is done
  };
  Status st = [&]() -> Status {
    // The lead stream starts after every stream's earlier work.
    for (size_t i = 1; i < streams.size(); ++i) {
      SHOAL_ASSIGN_OR_RETURN(cuda::EventHandle e, driver_.createEvent());
      events.push_back(e);
      SHOAL_TRY(driver_.recordEvent(e, streams[i]));
      SHOAL_TRY(driver_.streamWaitEvent(lead, e));
    }
    SHOAL_TRY(copyInputs(slot, ops, lead, /*async=*/true));
    if (mode == cuda::WaitMode::kMemOps) {
      SHOAL_TRY(driver_.writeValueAsync(slot.words + kReady, staged.seq, lead));
      SHOAL_TRY(driver_.waitValueAsync(slot.words + kDone, staged.seq, lead));
    } else {
      // Without memory operations: the words are written by copies of the
      // slot's sequence word (stable until the slot is released), and a
      // one-thread kernel waits.
      SHOAL_TRY(driver_.copyAsync(slot.words + kReady, slot.words + kSeqSource, sizeof(uint64_t), lead));
      SHOAL_TRY(driver_.launchWait(slot.words + kDone, staged.seq, lead));
    }
    SHOAL_TRY(copyOutputs(slot, ops, lead, /*async=*/true));
    if (mode == cuda::WaitMode::kMemOps) {
      SHOAL_TRY(driver_.writeValueAsync(slot.words + kReleased, staged.seq, lead));
    } else {
      SHOAL_TRY(driver_.copyAsync(slot.words + kReleased, slot.words + kSeqSource, sizeof(uint64_t), lead));
    }
    // Every stream's later work comes after the outputs.
    if (streams.size() > 1) {
      SHOAL_ASSIGN_OR_RETURN(cuda::EventHandle e, driver_.createEvent());
      events.push_back(e);
      SHOAL_TRY(driver_.recordEvent(e, lead));
      for (size_t i = 1; i < streams.size(); ++i) SHOAL_TRY(driver_.streamWaitEvent(streams[i], e));
    }
    return Status::ok();
  }();
  destroyEvents();
  if (st.isOk()) return st;
  if (st.code() == Code::kUnsupported) driver_.memOpsUnsupported(device_.ordinal);
  // Nothing may wait on a job that will not run: release the stream, then
  // wait until it has passed whatever was enqueued before freeing the slot.
  releaseStream(staged);
  // Once the stream has run all of it, the slot is free; a stream that
  // cannot be synchronized keeps it (never free memory a stream may write).
  if (driver_.synchronize(lead).isOk()) slot.busy = false;
  return st;
}

Status StreamBridge::enqueueAround(const Staged& staged, cuda::StreamHandle stream,
                                   const std::function<Status()>& body) {
  Slot& slot = *slots_[staged.slot];
  Status st = driver_.writeValueAsync(slot.words + kReady, staged.seq, stream);
  if (st.isOk()) st = body();
  Status end = driver_.writeValueAsync(slot.words + kDone, staged.seq, stream);
  if (end.isOk()) end = driver_.writeValueAsync(slot.words + kReleased, staged.seq, stream);
  if (!end.isOk()) {
    // The stream will not say it passed: once it has run what it holds, the
    // slot is free (a stream that cannot be synchronized keeps it).
    writeStreamWord(slot.words + kDone, staged.seq);
    if (driver_.synchronize(stream).isOk()) slot.busy = false;
  }
  return st.isOk() ? end : st;
}

Status StreamBridge::enqueueCaptured(const Staged& staged, std::span<const OpRequest> ops, void (*replay)(void*),
                                     void* arg) {
  Slot& slot = *slots_[staged.slot];
  const cuda::WaitMode mode = waitMode();
  if (mode == cuda::WaitMode::kSynchronous)
    return invalidUsage("a synchronous stream cannot replay collectives in CUDA graphs");
  slot.words[kZero] = 0;
  const cuda::StreamHandle stream = static_cast<cuda::StreamHandle>(ops[0].stream);
  SHOAL_TRY(copyInputs(slot, ops, stream, /*async=*/true));
  // "done" is reset before the job is handed over, and waited for after:
  // each replay waits for its own job's end (the engine writes done := seq).
  if (mode == cuda::WaitMode::kMemOps) SHOAL_TRY(driver_.writeValueAsync(slot.words + kDone, 0, stream));
  else SHOAL_TRY(driver_.copyAsync(slot.words + kDone, slot.words + kZero, sizeof(uint64_t), stream));
  SHOAL_TRY(driver_.launchHostFunction(stream, replay, arg));
  if (mode == cuda::WaitMode::kMemOps) SHOAL_TRY(driver_.waitValueAsync(slot.words + kDone, staged.seq, stream));
  else SHOAL_TRY(driver_.launchWait(slot.words + kDone, staged.seq, stream));
  return copyOutputs(slot, ops, stream, /*async=*/true);
}

void StreamBridge::releaseStream(const Staged& staged) {
  writeStreamWord(staged.done, staged.seq);
}

Status StreamBridge::copyIn(const Staged& staged, std::span<const OpRequest> ops) {
  for (cuda::StreamHandle s : Communicator::streamsOf(ops)) SHOAL_TRY(driver_.synchronize(s));
  return copyInputs(*slots_[staged.slot], ops, nullptr, /*async=*/false);
}

Status StreamBridge::copyOut(const Staged& staged, std::span<const OpRequest> ops) {
  return copyOutputs(*slots_[staged.slot], ops, nullptr, /*async=*/false);
}

void StreamBridge::release(const Staged& staged) { slots_[staged.slot]->busy = false; }

}  // namespace shoal
