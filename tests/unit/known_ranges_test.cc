// Known ranges (src/memory/known_ranges.h): which memory a transport may keep
// registrations of.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/scratch_pool.h"
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

namespace shoal {

// Detached jobs' scratch comes back to the pool and serves the next job: the
// same remembered memory, so a network's registration of it stays valid.
TEST_CASE("scratch pool: buffers are reused, remembered while they live, forgotten when freed", "[unit]") {
  auto pool = ScratchPool::make();
  uint8_t* first = nullptr;
  {
    std::shared_ptr<uint8_t> a = pool->take(1000);
    first = a.get();
    CHECK(memory::isRemembered(first, 1000));
    std::shared_ptr<uint8_t> b = pool->take(1000);  // a is still held: another one
    CHECK(b.get() != first);
  }
  CHECK(pool->keptForTest() == 2);
  std::shared_ptr<uint8_t> again = pool->take(500);
  CHECK((again.get() == first || memory::isRemembered(again.get(), 500)));
  std::shared_ptr<uint8_t> big = pool->take(1 << 20);  // larger than any kept: fresh
  CHECK(memory::isRemembered(big.get(), 1 << 20));
  uint8_t* bigAt = big.get();
  big.reset();
  again.reset();
  CHECK(pool->keptForTest() == 2);  // the largest ones kept, the rest freed
  std::shared_ptr<uint8_t> reused = pool->take(1 << 20);
  CHECK(reused.get() == bigAt);
  // A buffer outliving the pool's owner keeps the pool alive; the last one
  // out frees everything and forgets it.
  pool.reset();
  CHECK(memory::isRemembered(reused.get(), 1 << 20));
  reused.reset();
  CHECK_FALSE(memory::isRemembered(bigAt, 1));
}

}  // namespace shoal
