// Window: a buffer every rank of a communicator registered together
// (ncclCommWindowRegister), and where each rank's buffer lies in this
// process (docs/cuda.md, Windows).
//
// Role: Communicator::registerWindow describes this rank's buffer
// (describe(): device memory of a Shoal cuMem allocation is exported as a
// descriptor the owner holds open until registration ends), all-gathers the
// records, sends its allocation's descriptor to the peers' mailboxes
// (WindowMailbox) and all-gathers to whom it sent, maps each peer's buffer
// that it can (map()) and all-gathers which rank maps which, so that every
// rank knows the same (learnMaps()). A peer's buffer is mapped here when it
// is in this process (its address, unless device memory of another GPU not
// granted to this rank's: cuda::Driver::reachableFrom),
// host memory in the peer's shared allocation (mapped read-only), or device
// memory of the peer's cuMem allocation on a GPU that shares memory with
// this rank's (imported once per allocation through cuda::PeerImports,
// read-write, from the descriptor the peer sent). Anything else is
// registered but not mapped. release() gives the imports back.
// Owner: the Communicator (Windows); the API hands out its address as
// ncclWindow_t. Thread: registration on the user's thread (one at a time, as
// NCCL's rule for a communicator has it); once added to Windows it is only
// read, from any thread, until released.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/init_agreement.h"
#include "core/clock.h"
#include "core/peer_info.h"
#include "core/status.h"
#include "cuda/driver.h"
#include "engine/engine.h"
#include "net/fd.h"

namespace shoal {

// NCCL_WIN_COLL_SYMMETRIC: every rank passes its buffers at the same
// offsets in the window.
inline constexpr int kWindowSymmetric = 0x01;

class Window {
 public:
  Window(void* user, size_t bytes, int flags, int rank, int nranks);
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  void* userPtr() const { return user_; }
  size_t bytes() const { return bytes_; }
  int flags() const { return flags_; }
  int nranks() const { return static_cast<int>(buffers_.size()); }
  // Rank r's buffer as this process reaches it; nullptr when it is not
  // mapped here (this rank's own: the user's buffer). Host memory of a peer
  // process is mapped read-only.
  uint8_t* buffer(int r) const { return buffers_[static_cast<size_t>(r)]; }
  // Rank r's buffer's size, and its address in rank r's process.
  uint64_t bytesOf(int r) const { return sizes_[static_cast<size_t>(r)]; }
  uint64_t addressOf(int r) const { return addresses_[static_cast<size_t>(r)]; }
  // Whether rank a maps rank b's buffer: every rank knows the same.
  bool maps(int a, int b) const { return maps_[static_cast<size_t>(a)][static_cast<size_t>(b)]; }
  bool mappedEverywhere() const;
  // Whether every rank's buffer is CUDA device memory.
  bool deviceEverywhere() const;
  // The communicator's registrations before this one (the same window on
  // every rank).
  uint64_t registration() const { return registration_; }
  // Whether operations on it may run on the streams: every rank registered
  // it with NCCL_WIN_COLL_SYMMETRIC, has a window board that every rank
  // holds, and maps every rank's device buffer (the same on every rank).
  bool onStreams() const { return onStreams_; }
  void setRegistration(uint64_t registration, bool onStreams) {
    registration_ = registration;
    onStreams_ = onStreams;
  }

  // --- Registration steps (Communicator::registerWindow).
  // This rank's record. For device memory of a Shoal allocation, `exported`
  // holds the allocation's descriptor, which this rank sends to the peers
  // sendsTo() names.
  static Result<WindowRecord> describe(cuda::Driver* driver, void* buff, size_t bytes, net::Fd& exported);
  // Whether the owner of `mine` sends its descriptor to the owner of
  // `theirs`: an exported allocation, a mailbox it can reach and that takes
  // it (another process of this kernel, network namespace and user), and
  // GPUs that share memory.
  static bool sendsTo(const WindowRecord& mine, const WindowRecord& theirs, const PeerInfo& self,
                      const PeerInfo& peer, cuda::Driver* driver);
  // Maps rank r's buffer when this process can (no error when it cannot:
  // the rank's buffer is then not mapped here): `descriptor` is what rank r
  // sent for its device allocation, if it did. `self` and `peer` are the two
  // ranks' PeerInfo. The device import needs the rank's GPU context current.
  // Without `runsKernels` (this rank's device reduction kernels did not
  // load) no other rank's device buffer is mapped: a peer-reading plan on
  // device buffers is the kernels' work, and a rank that cannot run it must
  // keep every rank from choosing it (the maps are exchanged).
  void map(int r, const WindowRecord& record, const PeerInfo& self, const PeerInfo& peer, cuda::Driver* driver,
           bool runsKernels, net::Fd descriptor = net::Fd());
  // What this rank says in the last all-gather, and what every rank said.
  WindowFlags mapsFlags(std::string error) const;
  Status learnMaps(const std::vector<WindowFlags>& all);
  // Unmaps what map() imported (the rank's GPU context current).
  void release(cuda::Driver* driver);

 private:
  void* user_;
  size_t bytes_;
  int flags_;
  int rank_;
  std::vector<uint8_t*> buffers_;
  std::vector<uint64_t> sizes_;
  std::vector<uint64_t> addresses_;
  std::vector<bool> device_;  // per rank: its buffer is device memory
  std::vector<std::vector<bool>> maps_;  // [a][b]: a maps b's buffer
  std::vector<uint8_t*> imported_;       // from cuda::PeerImports, given back by release()
  uint64_t registration_ = 0;
  bool onStreams_ = false;
};

// Windows: a communicator's live windows, and where peers' buffers inside
// them lie here (PeerBuffers: a device plan reading peers' buffers looks
// them up, from the engine's thread). Owner: the Communicator, shared with
// the jobs reading through it. A deregistered window is retired first and
// released once no job that may read it is left (Communicator).
// Thread-safety: every method may be called from any thread.
class Windows final : public PeerBuffers {
 public:
  // Every communicator's Windows, for retireMemory (weakly held).
  static std::shared_ptr<Windows> make();
  // Retires, in every communicator of the process, the windows whose own
  // buffer overlaps memory being freed (ncclMemFree): the address may come
  // back in another allocation, whose windows must not be taken for them.
  static void retireMemory(const void* base, size_t bytes);

  void add(std::unique_ptr<Window> window);
  // Retires the live window `handle` names (false: there is none): no new
  // operation uses it, and operations already submitted still find its
  // peers' buffers until takeRetired() hands it over for release.
  bool retire(const void* handle);
  // Numbers the operations that may read windows, in submission order: a
  // window retired after operation k was submitted is read by k at the most.
  uint64_t noteSubmitted() { return submitted_.fetch_add(1, std::memory_order_acq_rel) + 1; }
  // The retired windows no operation after `passed` (every operation up to
  // it is through) may read.
  std::vector<std::unique_ptr<Window>> takeRetired(uint64_t passed);
  // Every window, live or retired.
  std::vector<std::unique_ptr<Window>> takeAll();
  Window* find(const void* handle) const;
  bool empty() const { return count_.load(std::memory_order_acquire) == 0; }
  // Whether [p, p + bytes) of this rank lies inside one window whose every
  // rank's buffer is device memory that every rank maps. Lookups take the
  // newest window first: one registered over memory freed and allocated
  // again at the same address (without a deregistration) is shadowed.
  bool holdsEverywhere(const void* p, uint64_t bytes) const;
  uint8_t* find(int peer, uint64_t address, uint64_t bytes) const override;
  // Where a windowed operation's buffers lie when both are in windows that
  // run on the streams (Window::onStreams): the windows and offsets, and,
  // per rank, its send and receive buffers here at those offsets (the
  // symmetric promise). Empty when either is not in such a window; an
  // error when a rank's window is too small for those offsets.
  struct OnStreams {
    uint64_t sendRegistration = 0, recvRegistration = 0, sendOffset = 0, recvOffset = 0;
    std::vector<std::array<uint8_t*, 2>> buffers;
  };
  Result<std::optional<OnStreams>> onStreams(const void* send, uint64_t sendBytes, const void* recv,
                                             uint64_t recvBytes) const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Window>> windows_;
  std::vector<std::unique_ptr<Window>> retired_;
  std::vector<uint64_t> retiredAt_;  // per retired window: operations submitted then
  std::atomic<uint64_t> submitted_{0};
  // Moves the live windows `which` picks to the retired ones; how many.
  size_t retireWhere(const std::function<bool(const Window&)>& which);

  std::atomic<size_t> count_{0};  // live windows
};

// WindowMailbox: where a rank receives its peers' window descriptors during
// one registration: an abstract Unix socket of its process (same user only),
// each message a ticket and one descriptor (SCM_RIGHTS). The ticket names
// the communicator, the registration, sender and receiver, and proves the
// communicator's secret (HMAC-SHA256), so no other process of the user can
// slip in a descriptor. A descriptor needs no right over the sender's process
// (pidfd_getfd would need the right to ptrace it). Thread: one user.
class WindowMailbox {
 public:
  static constexpr size_t kTicketBytes = 64;
  struct Ticket {
    uint64_t commId = 0;
    uint64_t registration = 0;  // the communicator's registrations so far
    int from = 0;
    int to = 0;
  };
  static Result<WindowMailbox> open();
  const std::string& name() const { return name_; }
  // Queues `fd` with its ticket at the mailbox `mailbox` (returns once the
  // kernel holds it: the receiver need not be reading).
  static Status send(const std::string& mailbox, int fd, const Ticket& ticket, std::string_view secret,
                     Deadline deadline);
  // One descriptor from each rank q with from[q], by rank, checked against
  // `expected` (its `from` ignored); until `deadline`.
  Result<std::vector<net::Fd>> receive(const std::vector<bool>& from, Ticket expected, std::string_view secret,
                                       Deadline deadline);
  // Several kinds at once (a registration's descriptors and boards, whose
  // messages may come in any order): per kind, one descriptor from each
  // rank q with from[q].
  struct Wanted {
    Ticket ticket;
    std::vector<bool> from;
  };
  Result<std::vector<std::vector<net::Fd>>> receiveEach(const std::vector<Wanted>& wanted, std::string_view secret,
                                                        Deadline deadline);

 private:
  net::Fd listener_;
  std::string name_;
};

}  // namespace shoal
