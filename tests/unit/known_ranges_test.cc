// Known ranges (src/memory/known_ranges.h): which memory a transport may keep
// registrations of.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "memory/known_ranges.h"

namespace shoal::memory {

TEST_CASE("known ranges: inside one remembered range only, until any overlapping forget", "[unit]") {
  std::vector<uint8_t> a(4096), b(4096);
  const uint8_t* pa = a.data();
  CHECK_FALSE(isRemembered(pa, 16));
  rememberRange(pa, a.size());
  CHECK(isRemembered(pa, a.size()));
  CHECK(isRemembered(pa + 100, 200));
  CHECK_FALSE(isRemembered(pa + 100, a.size()));  // runs past its end
  CHECK_FALSE(isRemembered(pa - 1, 2));           // starts before it
  const auto range = rememberedRangeOf(pa + 8, 8);
  REQUIRE(range);
  CHECK(range->first == reinterpret_cast<uintptr_t>(pa));
  CHECK(range->second == reinterpret_cast<uintptr_t>(pa) + a.size());

  // Two ranges (one nested in the other, as a registered part of an
  // allocation): a forget anywhere inside ends both.
  rememberRange(pa + 1024, 1024);
  rememberRange(b.data(), b.size());
  forgetRange(pa + 1500, 1);
  CHECK_FALSE(isRemembered(pa, 16));
  CHECK_FALSE(isRemembered(pa + 1024, 16));
  CHECK(isRemembered(b.data(), b.size()));  // untouched
  forgetRange(b.data(), b.size());
  CHECK_FALSE(isRemembered(b.data(), 1));

  // Empty or NULL ranges are never remembered.
  rememberRange(nullptr, 64);
  rememberRange(pa, 0);
  CHECK_FALSE(isRemembered(pa, 1));
  CHECK_FALSE(isRemembered(nullptr, 1));
}

}  // namespace shoal::memory
