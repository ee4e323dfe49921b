// Monotonic time and deadlines. Every wait in Shoal has one (docs/design.md,
// Principles).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>

namespace shoal {

using Clock = std::chrono::steady_clock;

inline int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// A point in time to give up waiting, optionally tied to a cancel flag:
// cancelledBy() makes it expire as soon as the flag is set (ncclCommAbort of a
// communicator still initializing), alsoCancelledBy() as soon as a second one
// is. A plain value, cheap to copy; the flags must outlive every copy that is
// waited on.
class Deadline {
 public:
  // A wait on a cancellable deadline wakes at least this often to look at the flag.
  static constexpr int64_t kCancelCheckMs = 100;

  static Deadline never() { return Deadline(std::numeric_limits<int64_t>::max()); }
  // Passed already: a wait on it looks once and does not wait.
  static Deadline passed() { return Deadline(nowNs()); }
  // 0 or less: never (a timeout setting of 0 means none).
  static Deadline afterMs(int64_t ms) {
    return ms <= 0 ? never() : Deadline(nowNs() + ms * 1000000);
  }
  // This deadline, also expired once *flag is true (null: not cancellable).
  Deadline cancelledBy(const std::atomic<bool>* flag) const {
    Deadline d = *this;
    d.cancel_ = flag;
    return d;
  }
  // This deadline, also expired once a second flag is true (a reason of the
  // waiter's own beside the communicator's abort); the first flag stays.
  Deadline alsoCancelledBy(const std::atomic<bool>* flag) const {
    Deadline d = *this;
    d.alsoCancel_ = flag;
    return d;
  }
  // This deadline, or `ms` from now if that is sooner; the cancel flag carries over.
  Deadline cappedMs(int64_t ms) const {
    Deadline capped = afterMs(ms);
    return (capped.atNs_ < atNs_ ? capped : *this).cancelledBy(cancel_).alsoCancelledBy(alsoCancel_);
  }

  bool cancelled() const {
    return (cancel_ != nullptr && cancel_->load(std::memory_order_acquire)) ||
           (alsoCancel_ != nullptr && alsoCancel_->load(std::memory_order_acquire));
  }
  bool expired() const {
    return cancelled() || (atNs_ != std::numeric_limits<int64_t>::max() && nowNs() >= atNs_);
  }
  int64_t remainingMs() const {
    if (cancelled()) return 0;
    if (atNs_ == std::numeric_limits<int64_t>::max()) return std::numeric_limits<int32_t>::max();
    int64_t left = (atNs_ - nowNs()) / 1000000;
    return left < 0 ? 0 : left;
  }
  // When the deadline passes (max for never), ignoring the cancel flag.
  int64_t atNs() const { return atNs_; }
  // When a sleeping wait should next wake to re-check: atNs(), or sooner if
  // the deadline can be cancelled (max: sleep until woken).
  int64_t wakeAtNs() const {
    if (cancel_ == nullptr && alsoCancel_ == nullptr) return atNs_;
    int64_t check = nowNs() + kCancelCheckMs * 1000000;
    return check < atNs_ ? check : atNs_;
  }

 private:
  explicit Deadline(int64_t atNs) : atNs_(atNs) {}
  int64_t atNs_;
  const std::atomic<bool>* cancel_ = nullptr;
  const std::atomic<bool>* alsoCancel_ = nullptr;
};

// Spin, then yield, then sleep: two ranks on two cores must not starve each
// other (docs/design.md, Threading). Call pause() once per idle iteration;
// reset() on progress.
class Backoff {
 public:
  void pause();
  void reset() { idle_ = 0; }
  // Still in the spinning phase: the next pause() will not yield or sleep.
  bool spinning() const { return idle_ < spinPasses_; }

  // Idle passes that spin before the first yield, for every Backoff of the
  // process. Spinning wins when each waiting rank has a core (2 ranks on 2
  // cores: 8 B AllReduce 0.75 us, 2.2 us when yielding at once) and loses
  // when ranks outnumber cores: the rank that would produce the awaited
  // message waits for the spinner's time slice (2 emulated nodes x 2 ranks on
  // 2 cores: 8 B 170 us spinning 64 passes, 60-80 us yielding at once).
  static void setSpinPasses(uint32_t passes);
  static uint32_t spinPasses();

 private:
  uint32_t idle_ = 0;
  uint32_t spinPasses_ = spinPasses();
};

}  // namespace shoal
