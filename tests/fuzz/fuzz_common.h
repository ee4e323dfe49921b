// Helpers shared by the fuzz targets (tests/fuzz/README.md).
//
// Input: reads a fuzzer's byte string as little-endian fields; past the end
// every read yields zeros, so a harness never has to check lengths.
// SocketPair: a connected AF_UNIX stream pair, both ends non-blocking, that
// stands in for a TCP connection whose far end the harness plays.
// FUZZ_CHECK: a property that must hold; a violation aborts, which libFuzzer
// reports as a crash with the input that caused it.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace shoal_fuzz {

#define FUZZ_CHECK(cond, ...)                                                   \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", __FILE__,        \
                   __LINE__, #cond);                                            \
      std::fprintf(stderr, "  " __VA_ARGS__);                                   \
      std::fprintf(stderr, "\n");                                               \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), left_(size) {}

  size_t left() const { return left_; }
  bool empty() const { return left_ == 0; }

  uint8_t u8() { return static_cast<uint8_t>(le(1)); }
  uint16_t u16() { return static_cast<uint16_t>(le(2)); }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  // Up to n bytes (fewer at the end of the input).
  std::string_view bytes(size_t n) {
    n = n < left_ ? n : left_;
    std::string_view out(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    left_ -= n;
    return out;
  }
  std::string_view rest() { return bytes(left_); }

 private:
  uint64_t le(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n && left_ > 0; ++i, ++p_, --left_) v |= static_cast<uint64_t>(*p_) << (8 * i);
    return v;
  }
  const uint8_t* p_;
  size_t left_;
};

// Both ends non-blocking and close-on-exec; -1/-1 on failure (never expected).
struct SocketPair {
  int a = -1;
  int b = -1;
  static SocketPair make() {
    SocketPair p;
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) {
      std::perror("socketpair");
      std::abort();
    }
    p.a = fds[0];
    p.b = fds[1];
    return p;
  }
};

// Writes what the socket takes now; returns the bytes written.
inline size_t writeSome(int fd, const void* data, size_t n) {
  size_t done = 0;
  const auto* p = static_cast<const uint8_t*>(data);
  while (done < n) {
    ssize_t w = ::send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
  return done;
}

// Reads and discards whatever is queued on fd now.
inline void drain(int fd) {
  char buf[64 << 10];
  for (;;) {
    ssize_t r = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return;
  }
}

// The tenant fuzz_store_server's root serves; the seeds' hellos name it.
inline constexpr uint64_t kStoreTenantMagic = 0x5a5546544f4f5253ull;  // "SROOTFUZ"
inline constexpr uint8_t kStoreTenantSecret[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                                   12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                                                   23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

inline void closeFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace shoal_fuzz
