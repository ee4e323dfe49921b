// Ring order arithmetic (docs/design.md, Plans): positions, neighbours and
// distances on the ring a RankView defines.
//
// Role: pure value used by the ring and chain builders. A ring is a permutation
// of communicator ranks (RankView::ring; identity when empty). "Position" is an
// index into that permutation; data flows from position i to position i+1.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/plan.h"

namespace shoal::patterns {

// x mod n in [0, n) for any sign of x.
inline int wrap(int64_t x, int n) {
  int64_t m = x % n;
  return static_cast<int>(m < 0 ? m + n : m);
}

class RingOrder {
 public:
  // SHOAL_CHECKs that view.ring is empty or a permutation of [0, nranks).
  explicit RingOrder(const RankView& view);
  // A ring through `members` (communicator ranks, in ring order), seen from
  // `self`, which must be one of them.
  RingOrder(std::vector<int> members, int self);

  int size() const { return static_cast<int>(order_.size()); }
  int position() const { return self_; }                   // of view.rank
  int rankAt(int64_t position) const { return order_[wrap(position, size())]; }
  int positionOf(int rank) const { return positionOf_[rank]; }
  int next() const { return rankAt(self_ + 1); }           // where data goes
  int prev() const { return rankAt(self_ - 1); }           // where data comes from
  // Hops along the ring from `rank` to this rank (0 when rank is this rank).
  int distanceFrom(int rank) const;

 private:
  std::vector<int> order_;       // position -> rank
  std::vector<int> positionOf_;  // rank -> position
  int self_ = 0;
};

}  // namespace shoal::patterns
