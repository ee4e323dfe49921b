#include "collectives/patterns/ring.h"

#include <algorithm>
#include <utility>

#include "core/status.h"

namespace shoal::patterns {

RingOrder::RingOrder(const RankView& view) {
  SHOAL_CHECK(view.nranks >= 1, "nranks ", view.nranks);
  SHOAL_CHECK(view.rank >= 0 && view.rank < view.nranks, "rank ", view.rank, " of ", view.nranks);
  order_ = view.ring;
  if (order_.empty()) {
    order_.resize(view.nranks);
    for (int i = 0; i < view.nranks; ++i) order_[i] = i;
  }
  SHOAL_CHECK(static_cast<int>(order_.size()) == view.nranks, "ring has ", order_.size(),
              " ranks, communicator ", view.nranks);
  positionOf_.assign(view.nranks, -1);
  for (int pos = 0; pos < view.nranks; ++pos) {
    int rank = order_[pos];
    SHOAL_CHECK(rank >= 0 && rank < view.nranks && positionOf_[rank] < 0,
                "ring is not a permutation (rank ", rank, " at position ", pos, ")");
    positionOf_[rank] = pos;
  }
  self_ = positionOf_[view.rank];
}

RingOrder::RingOrder(std::vector<int> members, int self) : order_(std::move(members)) {
  SHOAL_CHECK(!order_.empty(), "an empty ring");
  int maxRank = 0;
  for (int rank : order_) {
    SHOAL_CHECK(rank >= 0, "rank ", rank, " in a ring");
    maxRank = std::max(maxRank, rank);
  }
  positionOf_.assign(static_cast<size_t>(maxRank) + 1, -1);
  for (int pos = 0; pos < size(); ++pos) {
    SHOAL_CHECK(positionOf_[order_[pos]] < 0, "rank ", order_[pos], " twice in a ring");
    positionOf_[order_[pos]] = pos;
  }
  SHOAL_CHECK(self >= 0 && self <= maxRank && positionOf_[self] >= 0, "rank ", self, " is not in the ring");
  self_ = positionOf_[self];
}

int RingOrder::distanceFrom(int rank) const {
  SHOAL_CHECK(rank >= 0 && rank < static_cast<int>(positionOf_.size()) && positionOf_[rank] >= 0, "rank ",
              rank, " is not in the ring");
  return wrap(self_ - positionOf_[rank], size());
}

}  // namespace shoal::patterns
