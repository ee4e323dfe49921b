// StreamBridge: a communicator's device-memory operations in CUDA stream
// order (docs/cuda.md).
//
// Role: the engine runs host plans on host memory. For an operation on
// memory CUDA knows (device, managed or pinned host), the bridge stages it:
// on the user's stream it enqueues copies of the inputs into pinned staging,
// a stream memory operation that writes the job's "ready" word, a wait for
// its "done" word, copies of the outputs back and a write of its "released"
// word; the engine runs the unchanged plan on the staging once it reads
// "ready" and writes "done" however the job ends (Job::streamReady/Done), so
// no stream waits forever. Where the device has no stream memory operations
// (or SHOAL_CUDA_WAIT=sync) the call synchronizes its streams and runs the
// job itself, copying synchronously.
//
// Staging is pinned host memory in slots, reused once the stream has written
// a slot's "released" word; the slots keep at most SHOAL_CUDA_STAGING_BYTES
// between operations. Every word a stream waits on lives in this process's
// pinned memory, so the engine can always release it.
//
// Threading: stage(), enqueue() and release() run on the communicator's
// calling thread (NCCL: one thread uses a communicator at a time) with the
// stream's context current; the engine only reads and writes the words.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "cuda/device_reducer.h"
#include "cuda/driver.h"

namespace shoal {

class StreamBridge {
 public:
  StreamBridge(cuda::Driver& driver, cuda::DeviceIdentity device);
  // Frees the staging where every stream has passed the operations staged
  // here (passed()); memory a stream may still write is never freed.
  ~StreamBridge();
  // Whether every stream has passed the operations staged here (released
  // their slots). From any thread once the communicator is gone.
  bool passed() const;
  StreamBridge(const StreamBridge&) = delete;
  StreamBridge& operator=(const StreamBridge&) = delete;

  const cuda::DeviceIdentity& device() const { return device_; }
  // The device reduction kernels of the bridge's context, loaded with every
  // kernel resolved when the bridge was made (the communicator's first use of
  // a device); null where they could not be loaded (the reason is logged at
  // INFO; staging does not need them).
  const cuda::DeviceReducer* deviceReducer() const { return reducer_; }
  cuda::WaitMode waitMode() { return driver_.waitMode(device_.ordinal); }

  // Whether op runs in stream order: some buffer it uses is memory CUDA
  // knows. A call that mixes such memory with pageable host memory is an
  // invalid argument, with the reason.
  Result<bool> streamOrdered(const OpRequest& op, int rank, int nranks);

  // One staged submission: the operations rewritten onto staging and the
  // slot whose words and staging they use.
  struct Staged {
    std::vector<OpRequest> ops;
    const uint64_t* ready = nullptr;
    uint64_t* done = nullptr;
    uint64_t seq = 0;
    size_t slot = 0;
  };
  // Takes a slot with staging for the operations and rewrites them onto it
  // (zero-byte buffers stay null; buffers that overlap keep their relation,
  // so in-place calls stay in place).
  // With `direct` (a device plan) nothing is staged: the operations keep
  // their device buffers and the slot gives only its words.
  Result<Staged> stage(std::span<const OpRequest> ops, int rank, int nranks, bool direct = false);
  // A slot for operations captured into a CUDA graph: words and staging in
  // an allocation of their own (words no other operation used: a replay
  // resets "done" to 0, which a finished job the engine has yet to see end
  // would otherwise never see reached), the graph's until *graphGone (set
  // when the graph and its executable graphs are destroyed). They count
  // neither against SHOAL_CUDA_STAGING_BYTES nor as work the streams have
  // yet to pass (passed()), and are never freed while the graph lives: the
  // bridge's end leaves them to whichever bridge next reclaims once the
  // graph is gone. `direct` (a device plan replays it): no staging of the
  // buffers (the allocation's minimum only), the operations left on their
  // own buffers, nothing copied in or out.
  Result<Staged> stageCaptured(std::span<const OpRequest> ops, int rank, int nranks,
                               std::shared_ptr<const std::atomic<bool>> graphGone, bool direct = false);
  // Records the captured operations on their stream, which is being
  // captured (one stream): inputs in, "done := 0", a host node that calls
  // replay(arg) (which must hand the job to the engine, never wait), a wait
  // for "done >= seq", outputs out. Every launch of the graph replays it.
  Status enqueueCaptured(const Staged& staged, std::span<const OpRequest> ops, void (*replay)(void*), void* arg);
  // Enqueues the staged operations on their streams (memory operations or
  // wait kernel mode): inputs in, ready, wait for done, outputs out,
  // released. Several
  // streams are joined to the first with events, and wait for it at the end.
  // On failure nothing is left waiting: the slot's done word is written.
  Status enqueue(const Staged& staged, std::span<const OpRequest> ops);
  // A stream plan's words (memory operations mode only): on `stream`, writes
  // the slot's ready word, then enqueues what `body` enqueues, then writes
  // its done and released words, whatever body returned (its error is
  // returned; the slot comes back once the stream has passed it).
  Status enqueueAround(const Staged& staged, cuda::StreamHandle stream, const std::function<Status()>& body);
  // Synchronous mode: waits for the streams, copies the inputs in; after the
  // job ran, copyOut copies the outputs back.
  Status copyIn(const Staged& staged, std::span<const OpRequest> ops);
  Status copyOut(const Staged& staged, std::span<const OpRequest> ops);
  // Gives the slot back now (a submission that never reached a stream, or
  // a synchronous one that finished).
  void release(const Staged& staged);
  // Lets the stream go on past a submission the engine will never run.
  static void releaseStream(const Staged& staged);

 private:
  // Where one operation's buffers sit in its slot's staging.
  struct Placement {
    uint64_t sendBytes = 0, recvBytes = 0;
    uint64_t outBegin = 0, outEnd = 0;  // recv bytes the operation defines
    uint64_t sendOffset = 0, recvOffset = 0, scalarOffset = 0;
    bool stagedScalar = false;
  };
  struct Slot {
    uint64_t* words = nullptr;  // [0] ready, [1] done, [2] released, [3] seq (copy source)
    uint8_t* staging = nullptr;
    uint64_t stagingBytes = 0;
    uint64_t seq = 0;
    bool busy = false;          // handed out; free again once words[2] >= seq
    // A captured operation's slot (stageCaptured): `memory` holds its words
    // and then its staging, until the graph is gone; then it is freed and
    // the slot waits, empty, for the next captured operation.
    bool captured = false;
    uint8_t* memory = nullptr;
    std::shared_ptr<const std::atomic<bool>> graphGone;
    std::vector<Placement> placements;
  };
  static constexpr int kReady = 0, kDone = 1, kReleased = 2, kSeqSource = 3, kZero = 4;
  static constexpr uint64_t kCapturedWordsBytes = 256;  // a captured slot's words, before its staging
  static constexpr uint64_t kWordsPerSlot = 8;  // one cache line each
  static constexpr uint64_t kSlotsPerPage = 64;
  static constexpr uint64_t kAlign = 256;       // as cudaMalloc aligns

  // Waits (at most kThrottleMs) while the staging of operations still on
  // their streams plus stagingBytes exceeds SHOAL_CUDA_STAGING_BYTES.
  void throttle(uint64_t stagingBytes);
  static constexpr int64_t kThrottleMs = 2000;
  bool overBoundLogged_ = false;
  Result<size_t> takeSlot(uint64_t stagingBytes);
  Result<size_t> takeCapturedSlot(uint64_t stagingBytes, std::shared_ptr<const std::atomic<bool>> graphGone);
  // Where each operation's buffers go in a slot's staging, and its size.
  std::vector<Placement> layOut(std::span<const OpRequest> ops, int rank, int nranks, bool direct,
                                uint64_t& total) const;
  Staged handOut(size_t index, std::vector<Placement> placements, std::span<const OpRequest> ops, bool direct);
  void freeCaptured(Slot& slot);
  // Frees a slot's staging, telling the transports first (transports/registry.h).
  void freeStaging(Slot& slot);
  // Marks the slots whose streams are through with them idle; with
  // `mayFree`, frees what graphs let go of and idle staging over the bound.
  // Not while the caller's stream is being captured: a free may synchronize
  // the device, which a capture cannot join (PyTorch's allocator never frees
  // then either); the next call that is not captured frees it.
  void reclaim(bool mayFree = true);
  Status newDoorbellPage();
  // Copies every op's inputs into (or outputs out of) its staging; async on
  // each op's stream's lead stream, or synchronous.
  Status copyInputs(const Slot& slot, std::span<const OpRequest> ops, cuda::StreamHandle stream, bool async);
  Status copyOutputs(const Slot& slot, std::span<const OpRequest> ops, cuda::StreamHandle stream, bool async);

  cuda::Driver& driver_;
  const cuda::DeviceIdentity device_;
  const cuda::DeviceReducer* reducer_ = nullptr;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<uint64_t*> doorbellPages_;
  std::vector<uint64_t*> freeWords_;
  uint64_t nextSeq_ = 1;
};

}  // namespace shoal
