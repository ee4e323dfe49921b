#include "core/log.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string_view>

#include "core/params.h"
#include "core/process.h"

namespace shoal {
namespace {

struct LogConfig {
  LogLevel level = LogLevel::kNone;
  uint32_t flags = 0;
  FILE* out = stdout;
  std::string host;
};

uint32_t parseSubsys(const std::string& text) {
  std::string_view s = text;
  bool negate = !s.empty() && s[0] == '^';
  if (negate) s.remove_prefix(1);
  uint32_t mask = 0;
  struct Name { const char* name; uint32_t flag; };
  static const Name kNames[] = {
      {"INIT", subsys::kInit}, {"COLL", subsys::kColl}, {"P2P", subsys::kP2p},
      {"SHM", subsys::kShm}, {"NET", subsys::kNet}, {"GRAPH", subsys::kGraph},
      {"TUNING", subsys::kTuning}, {"ENV", subsys::kEnv}, {"ALLOC", subsys::kAlloc},
      {"CALL", subsys::kCall}, {"PROXY", subsys::kProxy}, {"BOOTSTRAP", subsys::kBootstrap},
      {"REG", subsys::kReg}, {"DESTROY", subsys::kDestroy}, {"ALL", subsys::kAll}};
  while (!s.empty()) {
    auto comma = s.find(',');
    std::string_view item = s.substr(0, comma);
    for (const auto& n : kNames)
      if (item.size() == std::strlen(n.name) && strncasecmp(item.data(), n.name, item.size()) == 0)
        mask |= n.flag;
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return negate ? ~mask : mask;
}

LogConfig load() {
  LogConfig c;
  const auto& p = params();
  const std::string& d = p.debug;
  if (strcasecmp(d.c_str(), "VERSION") == 0) c.level = LogLevel::kVersion;
  else if (strcasecmp(d.c_str(), "WARN") == 0) c.level = LogLevel::kWarn;
  else if (strcasecmp(d.c_str(), "INFO") == 0) c.level = LogLevel::kInfo;
  else if (strcasecmp(d.c_str(), "ABORT") == 0) c.level = LogLevel::kAbort;
  else if (strcasecmp(d.c_str(), "TRACE") == 0) c.level = LogLevel::kTrace;
  c.flags = parseSubsys(p.debugSubsys);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  c.host = host;
  if (auto dot = c.host.find('.'); dot != std::string::npos) c.host.resize(dot);
  if (!p.debugFile.empty() && c.level != LogLevel::kNone) {
    std::string path;
    for (size_t i = 0; i < p.debugFile.size(); ++i) {
      if (p.debugFile[i] == '%' && i + 1 < p.debugFile.size()) {
        char k = p.debugFile[++i];
        if (k == 'h') path += c.host;
        else if (k == 'p') path += std::to_string(currentPid());
        else path += k;
      } else {
        path += p.debugFile[i];
      }
    }
    if (FILE* f = std::fopen(path.c_str(), "a")) c.out = f;
  }
  return c;
}

std::mutex gMutex;
// A child forked while another thread wrote a line (or loaded the config)
// has only the forking thread: the lock, a leaf, starts afresh there.
// Registered as the library loads, not at a first log line, which a thread
// may write while it holds locks that a concurrent fork's handlers wait for.
[[maybe_unused]] const bool gLockRenewedInChild =
    pthread_atfork(nullptr, nullptr, [] { new (&gMutex) std::mutex(); }) == 0;
LogConfig* gConfig = nullptr;
std::atomic<bool> gLoaded{false};
// Set on every collective call: the initial-exec model makes that a plain
// store instead of a call to __tls_get_addr (4 bytes of the static TLS that
// glibc keeps for libraries loaded later, e.g. by dlopen).
[[gnu::tls_model("initial-exec")]] thread_local int tRank = -1;

// With gMutex held: gConfig is read; publish what derives from it.
void publishLoadedLocked() {
  detail::gLogCeiling.store(static_cast<int>(gConfig->level), std::memory_order_relaxed);
  gLoaded.store(true, std::memory_order_release);
}

const LogConfig& config() {
  if (!gLoaded.load(std::memory_order_acquire)) {
    {
      std::lock_guard<std::mutex> lock(gMutex);
      if (!gConfig) gConfig = new LogConfig(load());  // lives for the process
      publishLoadedLocked();
    }
    // The first time Shoal considers logging (the first ncclGetUniqueId or
    // communicator init, in practice), the NCCL variables it does not honour
    // are said, once per process. Outside the lock: it logs.
    logUnhonouredOnce();
  }
  return *gConfig;
}

}  // namespace

namespace detail {
std::atomic<int> gLogCeiling{static_cast<int>(LogLevel::kTrace) + 1};

bool logEnabledSlow(LogLevel level, uint32_t flags) {
  const LogConfig& c = config();
  if (level == LogLevel::kWarn || level == LogLevel::kVersion) return c.level >= level && c.level != LogLevel::kNone;
  return c.level >= level && (c.flags & flags) != 0;
}
}  // namespace detail

void logLine(LogLevel level, uint32_t /*flags*/, const char* file, int line, const std::string& msg) {
  const LogConfig& c = config();
  char rank[16] = "";
  if (tRank >= 0) std::snprintf(rank, sizeof(rank), "[%d] ", tRank);
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  long tid = syscall(SYS_gettid);
  std::lock_guard<std::mutex> lock(gMutex);
  if (level == LogLevel::kWarn)
    std::fprintf(c.out, "%s:%d:%ld %s%s:%d NCCL WARN %s\n", c.host.c_str(), currentPid(), tid, rank,
                 base, line, msg.c_str());
  else
    std::fprintf(c.out, "%s:%d:%ld %sNCCL %s %s\n", c.host.c_str(), currentPid(), tid, rank,
                 level == LogLevel::kTrace ? "TRACE" : "INFO", msg.c_str());
  std::fflush(c.out);
}

void setLogRank(int rank) { tRank = rank; }

void resetLogConfig() {
  std::lock_guard<std::mutex> lock(gMutex);
  delete gConfig;
  gConfig = new LogConfig(load());
  publishLoadedLocked();
}

}  // namespace shoal
