// Address ranges: the one containment check of buffers inside allocations
// and windows (a range near the top of the address space must not wrap).
#pragma once

#include <cstdint>

namespace shoal {

// Whether [address, address + bytes) lies inside [base, base + size).
inline bool rangeInside(uint64_t address, uint64_t bytes, uint64_t base, uint64_t size) {
  return address >= base && address - base <= size && bytes <= size - (address - base);
}

}  // namespace shoal
