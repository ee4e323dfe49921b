#include "core/process.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>

namespace shoal {
namespace {

std::atomic<int> gPid{0};

void forgetPid() { gPid.store(0, std::memory_order_relaxed); }

}  // namespace

int currentPid() {
  int pid = gPid.load(std::memory_order_relaxed);
  if (pid != 0) return pid;
  static const bool registered = [] { return pthread_atfork(nullptr, nullptr, forgetPid) == 0; }();
  pid = static_cast<int>(getpid());
  // Without the fork handler a cached id could outlive a fork: do not cache.
  if (registered) gPid.store(pid, std::memory_order_relaxed);
  return pid;
}

std::string localKernelId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

uint64_t pidNamespaceId() {
  struct stat st {};
  if (stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

uint64_t netNamespaceId() {
  struct stat st {};
  if (stat("/proc/self/ns/net", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

namespace {
thread_local bool tLibraryThread = false;
}  // namespace

void markLibraryThread() { tLibraryThread = true; }
bool isLibraryThread() { return tLibraryThread; }

}  // namespace shoal
