// Wire protocol of the TCP store (bootstrap root <-> clients).
//
// Role: the one definition of every byte the root and its clients exchange,
// shared by root_server.cc and tcp_store.cc. Thread: pure functions.
//
// Handshake (fixed sizes: nothing a peer sends before it is authenticated
// sizes an allocation). K is
// HMAC(secret, "shoal bootstrap v1" || magic), so the secret never crosses
// the wire and the nonces stop replays:
//   client -> ClientHello  {tag "SHBS", version, reserved, id magic, nonceC[16]}  32 B
//   root   -> Challenge    {tag "SHBS", version, reserved, nonceS[16],
//                           HMAC(K, "S" || nonceC || nonceS)}                    56 B
//   client -> Proof        {HMAC(K, "C" || nonceS || nonceC)}                     32 B
//   root   -> Accept       {tag "OKAY"}                                           4 B
// The root closes a connection whose id magic it does not serve, whose proof
// is wrong, or that does not finish within SHOAL_HANDSHAKE_TIMEOUT_MS.
//
// Frames (after the handshake), integers little-endian:
//   request  {u32 length, u64 requestId, u8 command, body}   length counts
//   reply    {u32 length, u64 requestId, u8 status,  body}   what follows it
// length <= kMaxFrameBytes (64 MiB) or the connection is dropped.
//   kSet   body {str key, str value}                       reply {}
//   kGet   body {u32 timeoutMs, u32 n, n x str key}        reply kOk {u32 n, n x str value}
//          (timeoutMs 0xffffffff: none)                     reply kTimeout {u32 n, n x str missing}
//   kErase body {u32 n, n x str key}                       reply {}
//   kCheck body {u32 n, n x str key}                       reply {u32 n, n x u8 exists}
//   str = {u32 length, bytes}. A malformed request gets kBadRequest {str why}.
// Replies to different requests may come out of order (a kGet waits for its
// keys while later requests are answered); requestId pairs them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/byte_order.h"
#include "net/crypto.h"

namespace shoal::bootstrap_wire {

inline constexpr uint32_t kHandshakeTag = 0x53424853;  // "SHBS"
inline constexpr uint32_t kAcceptTag = 0x59414b4f;     // "OKAY"
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kClientHelloBytes = 32;
inline constexpr size_t kChallengeBytes = 56;
inline constexpr size_t kProofBytes = 32;
inline constexpr size_t kAcceptBytes = 4;
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;
inline constexpr uint32_t kMaxKeyBytes = 64u << 10;
inline constexpr uint32_t kNoTimeout = 0xffffffffu;

enum Command : uint8_t { kSet = 1, kGet = 2, kErase = 3, kCheck = 4 };
enum ReplyStatus : uint8_t { kOk = 0, kTimeout = 1, kBadRequest = 2 };

// The HMAC key both sides derive from the id's secret and magic.
std::string deriveKey(const uint8_t secret[32], uint64_t magic);
net::Digest serverMac(const std::string& key, const uint8_t nonceC[kNonceBytes],
                      const uint8_t nonceS[kNonceBytes]);
net::Digest clientMac(const std::string& key, const uint8_t nonceS[kNonceBytes],
                      const uint8_t nonceC[kNonceBytes]);

// Appends little-endian values and length-prefixed strings.
class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(v); }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), p, p + n);
  }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  // Starts a frame {u32 length, u64 id, u8 kind}; finishFrame() fills length.
  size_t beginFrame(uint64_t id, uint8_t kind) {
    size_t at = out_.size();
    u32(0);
    u64(id);
    u8(kind);
    return at;
  }
  void finishFrame(size_t at) {
    uint32_t len = static_cast<uint32_t>(out_.size() - at - 4);
    putLe(out_.data() + at, len, 4);
  }

 private:
  void le(uint64_t v, int n) {
    uint8_t bytes[8];
    putLe(bytes, v, n);
    out_.insert(out_.end(), bytes, bytes + n);
  }
  std::vector<uint8_t>& out_;
};

// Reads from a bounded span; every read is checked, and a failed read makes
// ok() false for good (callers check once at the end).
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), left_(size) {}
  bool ok() const { return ok_; }
  bool atEnd() const { return left_ == 0; }
  uint8_t u8() { return static_cast<uint8_t>(le(1)); }
  uint16_t u16() { return static_cast<uint16_t>(le(2)); }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  void bytes(void* out, size_t n) {
    if (!take(n)) {
      std::memset(out, 0, n);
      return;
    }
    std::memcpy(out, p_ - n, n);
  }
  // A length-prefixed string no longer than maxBytes (and than what is left).
  std::string str(uint32_t maxBytes = kMaxFrameBytes) {
    uint32_t n = u32();
    if (!ok_ || n > maxBytes || n > left_) {
      ok_ = false;
      return {};
    }
    take(n);
    return std::string(reinterpret_cast<const char*>(p_ - n), n);
  }
  // A count of items each at least minItemBytes long: refuses counts the
  // remaining bytes cannot hold, so a count never sizes an allocation alone.
  uint32_t count(size_t minItemBytes) {
    uint32_t n = u32();
    if (!ok_ || (minItemBytes > 0 && n > left_ / minItemBytes)) {
      ok_ = false;
      return 0;
    }
    return n;
  }

 private:
  bool take(size_t n) {
    if (!ok_ || n > left_) {
      ok_ = false;
      return false;
    }
    p_ += n;
    left_ -= n;
    return true;
  }
  uint64_t le(int n) {
    if (!take(static_cast<size_t>(n))) return 0;
    return getLe(p_ - n, n);
  }
  const uint8_t* p_;
  size_t left_;
  bool ok_ = true;
};

}  // namespace shoal::bootstrap_wire
