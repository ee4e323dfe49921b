#include "bootstrap/store_protocol.h"

#include "core/byte_order.h"

namespace shoal::bootstrap_wire {

std::string deriveKey(const uint8_t secret[32], uint64_t magic) {
  uint8_t magicLe[8];
  putLe(magicLe, magic, 8);
  net::Digest k = net::HmacSha256(std::string_view(reinterpret_cast<const char*>(secret), 32))
                      .update("shoal bootstrap v1")
                      .update(magicLe, sizeof(magicLe))
                      .finish();
  return std::string(reinterpret_cast<const char*>(k.data()), k.size());
}

net::Digest serverMac(const std::string& key, const uint8_t nonceC[kNonceBytes],
                      const uint8_t nonceS[kNonceBytes]) {
  return net::HmacSha256(key).update("S").update(nonceC, kNonceBytes).update(nonceS, kNonceBytes).finish();
}

net::Digest clientMac(const std::string& key, const uint8_t nonceS[kNonceBytes],
                      const uint8_t nonceC[kNonceBytes]) {
  return net::HmacSha256(key).update("C").update(nonceS, kNonceBytes).update(nonceC, kNonceBytes).finish();
}

}  // namespace shoal::bootstrap_wire
