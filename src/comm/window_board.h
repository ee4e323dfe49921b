// WindowBoards: the words through which the ranks' streams meet when an
// operation on symmetric windows runs on the streams (docs/cuda.md,
// "Windows on the streams").
//
// Role: each rank of a communicator whose streams run stream memory
// operations has one board: pinned host memory in a memfd, mapped and
// registered for the GPU in every process that maps its windows (its
// descriptor goes to the peers' mailboxes with each window's, the receiver
// keeping the first; a rank of the same process finds it by address). Slot q of rank r's board is written by
// rank q's streams only: the descriptor of q's current windowed operation
// (its tag, windows and offsets, and a hash of them) and the count of
// messages q has sent r. So rank r's streams wait on its own board alone,
// and its host releases those waits by writing its own board.
//
// A windowed plan's messages become board operations (BoardLink, a
// StreamLink): a 64-byte descriptor message writes the descriptor into the
// peer's slot, and its receive waits until this rank's slot holds exactly
// the descriptor this rank would have sent (the same operation at the same
// offsets: what NCCL_WIN_COLL_SYMMETRIC promises); a zero-byte message
// counts up and its receive waits for the count. A peer that called
// something else leaves the wait stalled, and verify() names both calls.
//
// Owner: the Communicator (shared with its stream plans, which keep it
// while a stream may still use a board). Thread: adopt(), setCall() and the
// links' enqueue*() on the communicator's user thread; progress(),
// verify() and release() from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "cuda/driver.h"
#include "net/fd.h"
#include "transports/transport.h"

namespace shoal {

// What a windowed operation's descriptor message says: the same on every
// rank for one operation on symmetric windows.
struct WindowCall {
  uint64_t count = 0;                                   // elements (which decides the plan)
  uint64_t sendRegistration = 0, recvRegistration = 0;  // the communicator's registration index
  uint64_t sendOffset = 0, recvOffset = 0;              // in those windows, or kInPlaceOffset
};
// NCCL's in place (AllGather's send block inside its receive buffer,
// ReduceScatter's reverse): the block's offset differs per rank, so the
// descriptor names the larger buffer and says this.
inline constexpr uint64_t kInPlaceOffset = ~0ull;

class BoardMemory;
class BoardLink;

class WindowBoards {
 public:
  // This rank's board for `nranks`, registered for the GPU of the calling
  // thread's context.
  static Result<std::shared_ptr<WindowBoards>> create(cuda::Driver& driver, int rank, int nranks);
  ~WindowBoards();
  WindowBoards(const WindowBoards&) = delete;
  WindowBoards& operator=(const WindowBoards&) = delete;

  // This rank's board: its address here, and a descriptor to send.
  uint64_t address() const;
  int descriptor() const;
  // Rank q's board from the descriptor q sent (mapped and registered here),
  // or, in this process, at `address`. Once per rank: later ones are kept
  // (the same board).
  Status adopt(int q, net::Fd descriptor);
  Status adoptLocal(int q, uint64_t address);
  bool has(int q) const;

  // The descriptor the next plan's descriptor messages carry and expect.
  void setCall(const WindowCall& call);
  // Rank q's link (has(q) first).
  StreamLink* link(int q);

 private:
  WindowBoards(cuda::Driver& driver, int rank, int nranks, std::shared_ptr<BoardMemory> own);
  Status attach(int q, std::shared_ptr<BoardMemory> board);

  cuda::Driver& driver_;
  int rank_, nranks_;
  std::shared_ptr<BoardMemory> own_;
  std::vector<std::shared_ptr<BoardMemory>> boards_;  // per rank (own included)
  std::vector<std::unique_ptr<BoardLink>> links_;
  WindowCall call_;
};

// The board's layout, in 64-bit words (for tests and the links).
namespace board {
constexpr uint64_t kSlotWords = 8;  // a cache line per writer
// Header: word 0 is nonzero once the owner's communicator failed (its
// releases may have let its streams run on).
constexpr uint64_t kBroken = 0;
// Slot of rank q: words from kSlotWords * (1 + q).
constexpr uint64_t kHash = 0, kMessages = 1, kTag = 2, kCount = 3, kSendRegistration = 4, kRecvRegistration = 5,
                   kSendOffset = 6, kRecvOffset = 7;
inline uint64_t slot(int q) { return kSlotWords * (1 + static_cast<uint64_t>(q)); }
// Descriptors from rank q this rank's streams have passed (written by them).
inline uint64_t passed(int nranks, int q) { return slot(nranks) + static_cast<uint64_t>(q); }
uint64_t bytes(int nranks);
// The hash word of a descriptor: never 0 (a board starts zeroed).
uint64_t hash(uint64_t tag, const WindowCall& call, uint64_t sequence);
}  // namespace board

}  // namespace shoal
