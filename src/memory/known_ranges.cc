#include "memory/known_ranges.h"

#include <cstdint>
#include <set>
#include <mutex>
#include <iterator>
#include <utility>

namespace shoal::memory {
namespace {

// Ranges remembered more than this far below a lookup's start are not
// looked at (a miss: the caller registers per operation, correct and slower).
constexpr int kLookBack = 16;

struct Known {
  std::mutex mutex;
  std::set<std::pair<uintptr_t, uintptr_t>> ranges;  // [start, end)
};

Known& known() {
  static Known* k = new Known;  // never destroyed: frees may come from static destructors
  return *k;
}

std::pair<uintptr_t, uintptr_t> rangeOf(const void* base, size_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(base);
  return {start, start + bytes};
}

}  // namespace

void rememberRange(const void* base, size_t bytes) {
  if (base == nullptr || bytes == 0) return;
  Known& k = known();
  std::lock_guard<std::mutex> lock(k.mutex);
  k.ranges.insert(rangeOf(base, bytes));
}

void forgetRange(const void* base, size_t bytes) {
  const auto [start, end] = rangeOf(base, bytes == 0 ? 1 : bytes);
  Known& k = known();
  std::lock_guard<std::mutex> lock(k.mutex);
  // Every range starting below `end` that reaches past `start`; ranges are
  // few (buffers registered or allocated through Shoal), so a scan is fine.
  for (auto it = k.ranges.begin(); it != k.ranges.end() && it->first < end;)
    it = it->second > start ? k.ranges.erase(it) : std::next(it);
}

std::optional<std::pair<uintptr_t, uintptr_t>> rememberedRangeOf(const void* base, size_t bytes) {
  const auto [start, end] = rangeOf(base, bytes);
  Known& k = known();
  std::lock_guard<std::mutex> lock(k.mutex);
  auto it = k.ranges.upper_bound({start, UINTPTR_MAX});
  for (int i = 0; i < kLookBack && it != k.ranges.begin(); ++i) {
    --it;
    if (it->first <= start && end <= it->second) return *it;
  }
  return std::nullopt;
}

}  // namespace shoal::memory
