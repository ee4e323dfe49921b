// The calling process's id without a system call.
//
// glibc no longer caches getpid(), and a system call costs about a
// microsecond on a paravirtualized guest like the development VM (1.1 us
// measured), which peer-reading plans paid several times per operation.
#pragma once

namespace shoal {

// getpid(), read once per process and refreshed in a fork()ed child.
int currentPid();

}  // namespace shoal
