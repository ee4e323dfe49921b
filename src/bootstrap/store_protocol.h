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
//   kWill  body {str key, str value}                       reply {}
//          (when the client's side closes this connection, the root sets
//          key to value unless the key exists then; the same key again
//          replaces the value)
//   kCancelWill body {str key}                             reply {}
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
#include "core/wire.h"
#include "net/crypto.h"

namespace shoal::bootstrap_wire {

inline constexpr uint32_t kHandshakeTag = 0x53424853;  // "SHBS"
inline constexpr uint32_t kAcceptTag = 0x59414b4f;     // "OKAY"
inline constexpr uint16_t kVersion = 2;  // 2: wills
inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kClientHelloBytes = 32;
inline constexpr size_t kChallengeBytes = 56;
inline constexpr size_t kProofBytes = 32;
inline constexpr size_t kAcceptBytes = 4;
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;
inline constexpr uint32_t kMaxKeyBytes = 64u << 10;
inline constexpr uint32_t kNoTimeout = 0xffffffffu;
// Wills one connection may hold at once (one per communicator that uses it).
inline constexpr size_t kMaxWillsPerConnection = 65536;

enum Command : uint8_t { kSet = 1, kGet = 2, kErase = 3, kCheck = 4, kWill = 5, kCancelWill = 6 };
enum ReplyStatus : uint8_t { kOk = 0, kTimeout = 1, kBadRequest = 2 };

// The HMAC key both sides derive from the id's secret and magic.
std::string deriveKey(const uint8_t secret[32], uint64_t magic);
net::Digest serverMac(const std::string& key, const uint8_t nonceC[kNonceBytes],
                      const uint8_t nonceS[kNonceBytes]);
net::Digest clientMac(const std::string& key, const uint8_t nonceS[kNonceBytes],
                      const uint8_t nonceC[kNonceBytes]);

using wire::Reader;
using wire::Writer;

// Starts a frame {u32 length, u64 id, u8 kind}; finishFrame() fills length.
inline size_t beginFrame(Writer& w, uint64_t id, uint8_t kind) {
  size_t at = w.size();
  w.u32(0);
  w.u64(id);
  w.u8(kind);
  return at;
}
inline void finishFrame(Writer& w, size_t at) {
  w.patchU32(at, static_cast<uint32_t>(w.size() - at - 4));
}

}  // namespace shoal::bootstrap_wire
