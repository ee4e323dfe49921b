// The little cryptography the handshakes need: SHA-256, HMAC-SHA256 (FIPS
// 180-4, RFC 2104; checked against the RFC 4231 vectors in net_test.cc),
// random bytes from getrandom(2), and a constant-time comparison.
//
// Role: proofs of a shared secret without sending it (bootstrap root
// challenge-response, tcp transport hellos). Not a general crypto library.
// Thread: any; no state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/status.h"

namespace shoal::net {

using Digest = std::array<uint8_t, 32>;

// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  void update(std::string_view text) { update(text.data(), text.size()); }
  Digest finish();

 private:
  void compress(const uint8_t block[64]);
  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t totalBytes_ = 0;
};

Digest sha256(std::string_view data);

// Incremental HMAC-SHA256 with an arbitrary-length key.
class HmacSha256 {
 public:
  explicit HmacSha256(std::string_view key);
  HmacSha256& update(const void* data, size_t bytes) {
    inner_.update(data, bytes);
    return *this;
  }
  HmacSha256& update(std::string_view text) { return update(text.data(), text.size()); }
  template <typename T>
  HmacSha256& updateValue(const T& value) {  // trivially copyable, host byte order
    return update(&value, sizeof(value));
  }
  Digest finish();

 private:
  Sha256 inner_;
  uint8_t outerKeyPad_[64];
};

Digest hmacSha256(std::string_view key, std::string_view data);

// Fills `bytes` with getrandom(2) output.
Status randomBytes(void* data, size_t bytes);

// Equality that takes the same time wherever the inputs differ.
bool constantTimeEqual(const void* a, const void* b, size_t bytes);

// The transports' signed hellos (tcp, ofi): a fresh nonce, and
// proof = HMAC-SHA256(secret, label || the first `signedBytes` of the
// hello's kEncodedBytes encoding, nonce included). `encode(hello, out)`
// writes the encoding; Hello has `nonce` and `proof[32]` arrays.
template <size_t kEncodedBytes, typename Hello, typename Encode>
Digest helloProof(const Hello& hello, std::string_view secret, std::string_view label, size_t signedBytes,
                  Encode encode) {
  static_assert(sizeof(hello.proof) == sizeof(Digest));
  uint8_t bytes[kEncodedBytes];
  encode(hello, bytes);
  return HmacSha256(secret).update(label).update(bytes, signedBytes).finish();
}

template <size_t kEncodedBytes, typename Hello, typename Encode>
Status signHello(Hello& hello, std::string_view secret, std::string_view label, size_t signedBytes,
                 Encode encode) {
  SHOAL_TRY(randomBytes(hello.nonce, sizeof(hello.nonce)));
  Digest proof = helloProof<kEncodedBytes>(hello, secret, label, signedBytes, encode);
  std::memcpy(hello.proof, proof.data(), proof.size());
  return Status::ok();
}

template <size_t kEncodedBytes, typename Hello, typename Encode>
bool verifyHello(const Hello& hello, std::string_view secret, std::string_view label, size_t signedBytes,
                 Encode encode) {
  Digest expected = helloProof<kEncodedBytes>(hello, secret, label, signedBytes, encode);
  return constantTimeEqual(expected.data(), hello.proof, expected.size());
}

}  // namespace shoal::net
