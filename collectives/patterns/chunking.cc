#include "collectives/patterns/chunking.h"

#include <algorithm>

#include "core/status.h"

namespace shoal::patterns {

ElemRange evenPart(uint64_t count, uint64_t parts, uint64_t index, uint64_t granule) {
  SHOAL_CHECK(parts > 0 && index < parts && granule > 0);
  uint64_t units = ceilDiv(count, granule);  // the last unit may be partial
  auto boundary = [&](uint64_t i) {
    // i * units / parts without overflow for any realistic sizes (units < 2^58).
    uint64_t unit = static_cast<uint64_t>((static_cast<unsigned __int128>(i) * units) / parts);
    return std::min(count, unit * granule);
  };
  uint64_t begin = boundary(index);
  return ElemRange{begin, boundary(index + 1) - begin};
}

std::vector<ElemRange> evenParts(uint64_t count, uint64_t parts, uint64_t granule) {
  std::vector<ElemRange> out;
  out.reserve(parts);
  for (uint64_t i = 0; i < parts; ++i) out.push_back(evenPart(count, parts, i, granule));
  return out;
}

std::vector<ElemRange> segments(uint64_t count, uint64_t maxSegment, uint64_t granule) {
  uint64_t n = pieceCount(count, std::max<uint64_t>(maxSegment, 1));
  std::vector<ElemRange> out;
  out.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    ElemRange r = evenPart(count, n, i, granule);
    if (r.count > 0) out.push_back(r);
  }
  return out;
}

}  // namespace shoal::patterns
