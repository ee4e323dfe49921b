#include "collectives/patterns/ring.h"

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

int RingOrder::distanceFrom(int rank) const {
  SHOAL_CHECK(rank >= 0 && rank < size(), "rank ", rank, " outside a ring of ", size());
  return wrap(self_ - positionOf_[rank], size());
}

}  // namespace shoal::patterns
