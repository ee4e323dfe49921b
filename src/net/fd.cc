#include "net/fd.h"

#include <unistd.h>

namespace shoal::net {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);  // close(2) releases the fd even on EINTR on Linux
  fd_ = fd;
}

}  // namespace shoal::net
