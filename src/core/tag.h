// Message tags: who sent what, so a receiver can tell a mismatched call.
//
// Layout (64 bits): [63..60] collective kind + 1 (0 = untagged)
//                   [59..56] data type
//                   [55..48] 8-bit hash of (count, op, root)
//                   [47..0]  operation sequence number: per communicator for
//                            collectives, per (peer, direction) for Send/Recv.
// Send and Recv encode as kind Send, so that a matching pair has equal tags.
#pragma once

#include <cstdint>
#include <string>

#include "core/types.h"

namespace shoal {

struct TagFields {
  CollKind kind = CollKind::kAllReduce;
  DataType dtype = DataType::kFloat32;
  uint8_t argHash = 0;
  uint64_t seq = 0;
};

uint64_t encodeTag(CollKind kind, DataType dtype, uint64_t count, int op, int root, uint64_t seq);
// The same operation's tag with another sequence number: what encodeTag
// gives for equal (kind, dtype, count, op, root) and `seq`.
inline uint64_t withSeq(uint64_t tag, uint64_t seq) {
  constexpr uint64_t kSeqMask = 0xffffffffffffull;
  return (tag & ~kSeqMask) | (seq & kSeqMask);
}
TagFields decodeTag(uint64_t tag);
// "AllReduce #12 (float)" — for mismatch messages.
std::string describeTag(uint64_t tag);

}  // namespace shoal
