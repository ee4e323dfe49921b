// Fd: RAII owner of one file descriptor.
//
// Role: every socket, pipe or eventfd Shoal opens is wrapped in an Fd the moment
// it exists (docs/design.md, Style: RAII at birth), so that no error path can leak it.
// Owner: whoever holds the Fd; move-only. Thread: not synchronised — an Fd is
// used by the one object that owns it (closing an fd another thread is polling
// is a bug of the owner, not of Fd).
#pragma once

#include <utility>

namespace shoal::net {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }
  // Closes the current descriptor (if any) and takes `fd`.
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

}  // namespace shoal::net
