// The calling process's identity: its id without a system call, and the
// kernel it runs on.
//
// glibc no longer caches getpid(), and a system call costs about a
// microsecond on a paravirtualized guest like the development VM (1.1 us
// measured), which peer-reading plans paid several times per operation.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace shoal {

// getpid(), read once per process and refreshed in a fork()ed child.
int currentPid();

// /proc/sys/kernel/random/boot_id ("" where unreadable): the same for every
// process of this kernel, network namespaces and containers included.
std::string localKernelId();

// The inode of this process's pid namespace (/proc/self/ns/pid; 0 where
// unreadable). Two processes that report the same one, on one kernel, name
// each other by the same pid.
uint64_t pidNamespaceId();

// A file descriptor (device, inode) pair: what a file is, whichever
// descriptor names it.
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  bool operator==(const FileIdentity&) const = default;
};
Result<FileIdentity> fileIdentity(int fd);

// A new descriptor in this process for the file that process `pid` holds
// open as `fd` (pidfd_getfd: needs the right to ptrace it, as
// process_vm_readv does), refused unless it is the file `expected` names.
Result<int> copyDescriptorOf(int pid, int fd, const FileIdentity& expected);

}  // namespace shoal
