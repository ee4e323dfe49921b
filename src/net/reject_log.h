// RejectLog: rate-limited warnings about connections that were refused
// (scanners, stale peers, other jobs, garbage), so that a flood of them can
// neither flood the log nor hide.
//
// Role: one per listener. Thread: any (an internal mutex).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "core/clock.h"
#include "core/log.h"
#include "net/socket_address.h"

namespace shoal::net {

class RejectLog {
 public:
  explicit RejectLog(std::string listenerName) : name_(std::move(listenerName)) {}

  // Logs at most one line per second, with a count of those not shown.
  void note(const SocketAddress& peer, std::string_view why) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++unreported_;
    ++total_;
    int64_t now = nowNs();
    if (lastNs_ != 0 && now - lastNs_ < 1000000000) return;
    SHOAL_WARN(name_, ": rejected connection from ", peer.toString(), ": ", why,
               unreported_ > 1 ? str(" (and ", unreported_ - 1, " more since the last report)")
                               : std::string());
    lastNs_ = now;
    unreported_ = 0;
  }
  uint64_t total() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return total_;
  }

 private:
  const std::string name_;
  mutable std::mutex mutex_;
  int64_t lastNs_ = 0;
  uint64_t unreported_ = 0;
  uint64_t total_ = 0;
};

}  // namespace shoal::net
