// The calling process's identity: its id without a system call, and the
// kernel it runs on; which of its threads are Shoal's own.
//
// glibc no longer caches getpid(), and a system call costs about a
// microsecond on a paravirtualized guest like the development VM (1.1 us
// measured), which peer-reading plans paid several times per operation.
#pragma once

#include <cstdint>
#include <string>

namespace shoal {

// getpid(), read once per process and refreshed in a fork()ed child.
int currentPid();

// /proc/sys/kernel/random/boot_id ("" where unreadable): the same for every
// process of this kernel, network namespaces and containers included.
std::string localKernelId();

// The inode of this process's pid namespace (/proc/self/ns/pid; 0 where
// unreadable): processes of one kernel that report the same one name each
// other by the same pid.
uint64_t pidNamespaceId();

// The inode of this process's network namespace (/proc/self/ns/net; 0
// where unreadable): processes of one kernel that report the same one reach
// each other's abstract Unix sockets (net/unix_socket.h).
uint64_t netNamespaceId();

// Shoal's own threads (the engine's progress thread, set-up, connect and
// release threads) mark themselves at their start, so that what they may
// do differently from a user's thread is decided below the layers that
// start them (cuda::Driver gives them relaxed stream capture mode).
void markLibraryThread();
bool isLibraryThread();

}  // namespace shoal
