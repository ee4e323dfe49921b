#include "core/process.h"

#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

Result<FileIdentity> fileIdentity(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return error(Code::kSystemError, "fstat of descriptor ", fd, ": ", std::strerror(errno));
  return FileIdentity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

Result<int> copyDescriptorOf(int pid, int fd, const FileIdentity& expected) {
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return error(Code::kSystemError, "pidfd_open of process ", pid, ": ", std::strerror(errno));
  const int copy = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  const int saved = errno;
  close(pidfd);
  if (copy < 0)
    return error(Code::kSystemError, "pidfd_getfd of descriptor ", fd, " of process ", pid, ": ",
                 std::strerror(saved));
  Result<FileIdentity> found = fileIdentity(copy);
  if (!found.isOk() || !(found.value() == expected)) {
    close(copy);
    return error(Code::kSystemError, "descriptor ", fd, " of process ", pid, " is not the file it announced");
  }
  return copy;
#else
  (void)pid, (void)fd, (void)expected;
  return error(Code::kUnsupported, "this kernel's headers have no pidfd_getfd");
#endif
}

}  // namespace shoal
