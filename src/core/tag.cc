#include "core/tag.h"

#include "core/status.h"

namespace shoal {

uint64_t encodeTag(CollKind kind, DataType dtype, uint64_t count, int op, int root, uint64_t seq) {
  if (kind == CollKind::kRecv) kind = CollKind::kSend;
  uint64_t h = count * 0x9E3779B97F4A7C15ull;
  h ^= (static_cast<uint64_t>(static_cast<uint32_t>(op)) << 32) ^ static_cast<uint32_t>(root + 1);
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return (static_cast<uint64_t>(static_cast<int>(kind) + 1) << 60) |
         (static_cast<uint64_t>(static_cast<int>(dtype) & 0xf) << 56) | ((h & 0xff) << 48) |
         (seq & 0xffffffffffffull);
}

TagFields decodeTag(uint64_t tag) {
  TagFields f;
  f.kind = static_cast<CollKind>(static_cast<int>(tag >> 60) - 1);
  f.dtype = static_cast<DataType>((tag >> 56) & 0xf);
  f.argHash = static_cast<uint8_t>(tag >> 48);
  f.seq = tag & 0xffffffffffffull;
  return f;
}

std::string describeTag(uint64_t tag) {
  if ((tag >> 60) == 0) return str("untagged #", tag);
  TagFields f = decodeTag(tag);
  return str(collKindName(f.kind), " #", f.seq, " (", dataTypeName(f.dtype), ", args ",
             static_cast<int>(f.argHash), ")");
}

}  // namespace shoal
