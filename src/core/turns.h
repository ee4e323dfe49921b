// Turns: work that must run one at a time in the order it was asked for,
// whichever threads run it.
//
// Role: a communicator's set-up work over its bootstrap (splits, window
// registrations) must meet its peers' in call order, yet a nonblocking split
// runs on a thread of its own: the call takes a turn on the calling thread,
// and the work waits for it. A turn given up unused (work abandoned with its
// group) passes to the next at once; one whose work gave up half-way breaks
// the turns after it. Thread-safe; a Turn is used by one thread at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "core/clock.h"
#include "core/status.h"

namespace shoal {

class Turns : public std::enable_shared_from_this<Turns> {
 public:
  class Turn {
   public:
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;
    ~Turn() { done(); }
    // Until every earlier turn is done, or the deadline (kTimeout, or
    // kAborted where its cancel flag ended it); `what` names the work.
    Status wait(Deadline deadline, const char* what);
    // This turn's work is over (or never ran): the next may go. Idempotent.
    void done();
    // Its work ended without the step the later turns' work pairs with its
    // peers' (a split that gave up before its exchange): every later wait
    // fails with `why` instead of running, and this turn is done.
    void breakLater(const std::string& why);

   private:
    friend class Turns;
    Turn(std::shared_ptr<Turns> turns, uint64_t ticket) : turns_(std::move(turns)), ticket_(ticket) {}
    std::shared_ptr<Turns> turns_;
    uint64_t ticket_;
    bool done_ = false;
  };

  static std::shared_ptr<Turns> make() { return std::shared_ptr<Turns>(new Turns()); }
  // The next turn, in the order of these calls.
  std::shared_ptr<Turn> take();

 private:
  Turns() = default;
  void finish(uint64_t ticket);

  std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t next_ = 0;     // the ticket take() gives next
  uint64_t serving_ = 0;  // the ticket whose work may run
  std::set<uint64_t> finishedEarly_;  // done before their turn came (given up unused)
  std::string broken_;                // why later turns fail (breakLater), "" while they may run
};

}  // namespace shoal
