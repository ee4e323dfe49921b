// Chunking arithmetic: splitting a count of elements into near-equal parts.
//
// Role: pure functions used by every builder to cut a buffer into channel parts,
// rounds, chunks and segments. All sizes are in elements; a "granule" (elements)
// keeps part boundaries aligned (e.g. to 64 bytes) so the reducer and memcpy see
// aligned ranges; only the last part of a split may be a partial granule.
#pragma once

#include <cstdint>
#include <vector>

namespace shoal::patterns {

struct ElemRange {
  uint64_t begin = 0;  // elements
  uint64_t count = 0;
  uint64_t end() const { return begin + count; }
  bool operator==(const ElemRange&) const = default;
};

inline uint64_t ceilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Part `index` of `parts` near-equal parts of [0, count): boundaries are multiples
// of `granule` (except `count` itself); sizes differ by at most one granule; parts
// may be empty when count is small. Parts are contiguous and in order.
ElemRange evenPart(uint64_t count, uint64_t parts, uint64_t index, uint64_t granule = 1);
std::vector<ElemRange> evenParts(uint64_t count, uint64_t parts, uint64_t granule = 1);

// How many pieces of at most maxPiece elements cover count (0 for count 0).
inline uint64_t pieceCount(uint64_t count, uint64_t maxPiece) {
  return count == 0 ? 0 : ceilDiv(count, maxPiece == 0 ? 1 : maxPiece);
}

// Near-equal segments covering [0, count), each at most maxSegment elements when
// maxSegment is a multiple of granule; no empty segments; none when count is 0.
std::vector<ElemRange> segments(uint64_t count, uint64_t maxSegment, uint64_t granule = 1);

// Elements per 64-byte line for an element size (at least 1): the default granule.
inline uint64_t lineGranule(uint64_t elemSize) { return elemSize >= 64 ? 1 : 64 / elemSize; }

}  // namespace shoal::patterns
