// Monotonic time and deadlines. Every wait in Shoal has one (DESIGN.md §1).
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>

namespace shoal {

using Clock = std::chrono::steady_clock;

inline int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

class Deadline {
 public:
  static Deadline never() { return Deadline(std::numeric_limits<int64_t>::max()); }
  static Deadline afterMs(int64_t ms) {
    return ms <= 0 ? never() : Deadline(nowNs() + ms * 1000000);
  }
  bool expired() const { return atNs_ != std::numeric_limits<int64_t>::max() && nowNs() >= atNs_; }
  int64_t remainingMs() const {
    if (atNs_ == std::numeric_limits<int64_t>::max()) return std::numeric_limits<int32_t>::max();
    int64_t left = (atNs_ - nowNs()) / 1000000;
    return left < 0 ? 0 : left;
  }
  int64_t atNs() const { return atNs_; }

 private:
  explicit Deadline(int64_t atNs) : atNs_(atNs) {}
  int64_t atNs_;
};

// Spin, then yield, then sleep: two ranks on two cores must not starve each
// other (DESIGN.md §5). Call pause() once per idle iteration; reset() on progress.
class Backoff {
 public:
  void pause();
  void reset() { idle_ = 0; }

 private:
  uint32_t idle_ = 0;
};

}  // namespace shoal
