// Unix stream sockets in the abstract namespace, and messages that carry
// file descriptors (SCM_RIGHTS): how processes of one host hand each other
// shareable memory (cuda_ipc's FIFOs, windows' allocations).
//
// Abstract names belong to a network namespace: two processes reach each
// other's only inside one. Listeners accept only processes of the same
// user (acceptSameUser). Thread: none (functions on descriptors).
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "net/fd.h"

namespace shoal::net {

// The socket address of abstract name `name` (no leading '@').
sockaddr_un abstractAddress(const std::string& name, socklen_t& length);
// A non-blocking listener on "<prefix>-<pid>-<16 random hex digits>";
// `name` receives the name.
Result<Fd> listenAbstract(const std::string& prefix, std::string& name);
// A non-blocking connection to the listener `name`, retried while it
// refuses (its backlog full) until `deadline`.
Result<Fd> connectAbstract(const std::string& name, Deadline deadline);
// The next waiting connection of a non-blocking listener from a process of
// this user (others are closed and logged); an invalid Fd when none waits.
Fd acceptSameUser(int listener);

// Sends `bytes` with `fds` attached in one message (blocking until queued).
Status sendWithDescriptors(int socket, const void* bytes, size_t size, std::span<const int> fds);
// Reads one message of exactly `size` bytes carrying exactly `fds`
// descriptors without blocking; kAgain when none has arrived yet. The
// descriptors are owned by the caller (close-on-exec).
Result<std::vector<Fd>> receiveWithDescriptors(int socket, void* bytes, size_t size, size_t fds);

}  // namespace shoal::net
