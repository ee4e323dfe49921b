// Rank arithmetic of collectives/patterns/.
#include <catch2/catch.hpp>

#include <numeric>
#include <set>

#include "collectives/patterns/chunking.h"
#include "collectives/patterns/recursive_doubling.h"
#include "collectives/patterns/ring.h"
#include "collectives/patterns/tree.h"

namespace shoal::patterns {
namespace {

RankView view(int rank, int nranks, std::vector<int> ring = {}) {
  RankView v;
  v.rank = rank;
  v.nranks = nranks;
  v.ring = std::move(ring);
  return v;
}

TEST_CASE("wrap is a true modulo", "[patterns]") {
  REQUIRE(wrap(-1, 5) == 4);
  REQUIRE(wrap(-10, 5) == 0);
  REQUIRE(wrap(7, 5) == 2);
  REQUIRE(wrap(0, 1) == 0);
}

TEST_CASE("identity ring: neighbours and distances", "[patterns]") {
  RingOrder r(view(2, 5));
  REQUIRE(r.size() == 5);
  REQUIRE(r.position() == 2);
  REQUIRE(r.next() == 3);
  REQUIRE(r.prev() == 1);
  REQUIRE(r.distanceFrom(2) == 0);
  REQUIRE(r.distanceFrom(0) == 2);
  REQUIRE(r.distanceFrom(4) == 3);
  RingOrder last(view(4, 5));
  REQUIRE(last.next() == 0);
  RingOrder one(view(0, 1));
  REQUIRE(one.next() == 0);
  REQUIRE(one.prev() == 0);
}

TEST_CASE("custom ring order", "[patterns]") {
  std::vector<int> order = {3, 0, 2, 1};
  RingOrder r(view(0, 4, order));
  REQUIRE(r.position() == 1);
  REQUIRE(r.next() == 2);
  REQUIRE(r.prev() == 3);
  REQUIRE(r.rankAt(-1) == 1);
  REQUIRE(r.positionOf(1) == 3);
  REQUIRE(r.distanceFrom(3) == 1);
  REQUIRE(r.distanceFrom(1) == 2);
}

TEST_CASE("even parts cover the count / in order / near-equal / aligned", "[patterns]") {
  for (uint64_t count : {0, 1, 7, 64, 100, 1000, 4097}) {
    for (uint64_t parts : {1, 2, 3, 7, 16}) {
      for (uint64_t granule : {1, 4, 16}) {
        auto v = evenParts(count, parts, granule);
        REQUIRE(v.size() == parts);
        uint64_t at = 0, lo = UINT64_MAX, hi = 0;
        for (const ElemRange& r : v) {
          REQUIRE(r.begin == at);
          if (r.end() != count) REQUIRE(r.end() % granule == 0);
          at = r.end();
          lo = std::min(lo, r.count);
          hi = std::max(hi, r.count);
        }
        REQUIRE(at == count);
        REQUIRE(hi - lo <= granule);
      }
    }
  }
  REQUIRE(evenPart(10, 3, 0) == ElemRange{0, 3});
  REQUIRE(evenPart(10, 3, 2) == ElemRange{6, 4});
}

TEST_CASE("segments are bounded and non-empty", "[patterns]") {
  REQUIRE(segments(0, 8).empty());
  for (uint64_t count : {1, 8, 9, 100, 1023}) {
    for (uint64_t maxSeg : {1, 8, 16, 1000}) {
      auto v = segments(count, maxSeg, maxSeg % 4 == 0 ? 4 : 1);
      REQUIRE(v.size() == pieceCount(count, maxSeg));
      uint64_t at = 0;
      for (const ElemRange& r : v) {
        REQUIRE(r.begin == at);
        REQUIRE(r.count > 0);
        REQUIRE(r.count <= maxSeg);
        at = r.end();
      }
      REQUIRE(at == count);
    }
  }
  REQUIRE(lineGranule(4) == 16);
  REQUIRE(lineGranule(128) == 1);
}

TEST_CASE("recursive doubling fold and partners", "[patterns]") {
  for (int n = 1; n <= 33; ++n) {
    RecursiveDoubling rd(n);
    REQUIRE(rd.pof2() <= n);
    REQUIRE(rd.pof2() * 2 > n);
    REQUIRE((1 << rd.rounds()) == rd.pof2());
    std::set<int> virtuals;
    for (int p = 0; p < n; ++p) {
      REQUIRE(rd.foldedOut(p) != (rd.virtualOf(p) >= 0));
      if (rd.foldedOut(p)) {
        REQUIRE(rd.foldsIn(p + 1));
        continue;
      }
      int v = rd.virtualOf(p);
      REQUIRE(rd.participantOf(v) == p);
      virtuals.insert(v);
      for (int k = 0; k < rd.rounds(); ++k) {
        int partner = rd.partner(v, k);
        REQUIRE(partner < rd.pof2());
        REQUIRE(rd.partner(partner, k) == v);
      }
    }
    REQUIRE(static_cast<int>(virtuals.size()) == rd.pof2());
  }
}

TEST_CASE("binary tree arithmetic", "[patterns]") {
  REQUIRE(treeParent(0) == -1);
  REQUIRE(treeParent(1) == 0);
  REQUIRE(treeParent(2) == 0);
  REQUIRE(treeParent(6) == 2);
  REQUIRE(treeChildren(1, 5) == std::vector<int>{3, 4});
  REQUIRE(treeChildren(2, 5).empty());
  REQUIRE(treeChildren(2, 6) == std::vector<int>{5});
  REQUIRE(treeDepth(0) == 0);
  REQUIRE(treeDepth(6) == 2);
  for (int n = 1; n < 20; ++n) {
    int edges = 0;
    for (int v = 0; v < n; ++v) edges += static_cast<int>(treeChildren(v, n).size());
    REQUIRE(edges == n - 1);
  }
}

}  // namespace
}  // namespace shoal::patterns
