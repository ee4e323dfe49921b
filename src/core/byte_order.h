// Little-endian fields of Shoal's wire formats (ids, hellos, segment and
// store headers): every encoder and decoder of another process's bytes
// writes and reads integers through these two, whatever the host's order.
#pragma once

#include <cstdint>

namespace shoal {

// Writes the low `n` bytes of `v` (n <= 8), least significant first.
inline void putLe(uint8_t* out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Reads `n` bytes (n <= 8) written by putLe.
inline uint64_t getLe(const uint8_t* in, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}

}  // namespace shoal
