// NCCL-shaped logging: "host:pid:tid [rank] NCCL INFO message".
//
// Role: one process-wide logger configured from NCCL_DEBUG, NCCL_DEBUG_SUBSYS and
// NCCL_DEBUG_FILE (core/params.def). Any thread may log; lines are written whole.
// The rank shown is thread-local (setLogRank), set by the communicator code
// while it works for a rank.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace shoal {

enum class LogLevel : int { kNone = 0, kVersion = 1, kWarn = 2, kInfo = 3, kAbort = 4, kTrace = 5 };

// NCCL's subsystem flags (nccl_common.h values).
namespace subsys {
inline constexpr uint32_t kInit = 0x1, kColl = 0x2, kP2p = 0x4, kShm = 0x8, kNet = 0x10,
                          kGraph = 0x20, kTuning = 0x40, kEnv = 0x80, kAlloc = 0x100,
                          kCall = 0x200, kProxy = 0x400, kBootstrap = 0x1000, kReg = 0x2000,
                          kDestroy = 0x10000, kAll = ~0u;
}

namespace detail {
// The most verbose level the settings let through, or above kTrace until they
// are read: a line above it is off after one load and a compare at its call
// site (every collective call passes a TRACE line).
extern std::atomic<int> gLogCeiling;
bool logEnabledSlow(LogLevel level, uint32_t flags);
}  // namespace detail

inline bool logEnabled(LogLevel level, uint32_t flags) {
  if (static_cast<int>(level) > detail::gLogCeiling.load(std::memory_order_relaxed)) return false;
  return detail::logEnabledSlow(level, flags);
}
void logLine(LogLevel level, uint32_t flags, const char* file, int line, const std::string& msg);
void setLogRank(int rank);  // thread-local; -1 hides it
// Re-reads the log settings (tests).
void resetLogConfig();

}  // namespace shoal

#define SHOAL_LOG(level, flags, ...)                                                    \
  do {                                                                                  \
    if (::shoal::logEnabled(level, flags))                                              \
      ::shoal::logLine(level, flags, __FILE__, __LINE__, ::shoal::str(__VA_ARGS__));    \
  } while (0)
#define SHOAL_INFO(flags, ...) SHOAL_LOG(::shoal::LogLevel::kInfo, flags, __VA_ARGS__)
#define SHOAL_WARN(...) SHOAL_LOG(::shoal::LogLevel::kWarn, ::shoal::subsys::kAll, __VA_ARGS__)
#define SHOAL_TRACE(flags, ...) SHOAL_LOG(::shoal::LogLevel::kTrace, flags, __VA_ARGS__)
