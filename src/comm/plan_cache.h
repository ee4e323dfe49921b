// PlanCache: a communicator's tuner and the plans it chose, by operation
// shape (docs/design.md, Nouns: Plan, Tuner).
//
// Role: the tuner is a pure function of the shape for a communicator's
// lifetime, so a cached plan also stands for the tuner's decision: a repeated
// operation costs one hash lookup. A lone collective (with or without Send
// and Recv beside it) may get a peer-reading plan; collectives merged with
// others into one group job get plans of the view without peer reads, and
// the merged plan of a group is cached by its parts.
// Thread: the communicator's user thread only (NCCL: one thread uses a
// communicator at a time).
#pragma once

#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "collectives/plan.h"
#include "core/status.h"
#include "engine/engine.h"
#include "tuner/tuner.h"

namespace shoal {

// Same operation, whatever the buffers' placement (CollShape::disjointBuffers).
inline bool sameShapeButPlacement(const CollShape& a, const CollShape& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.op == b.op && a.count == b.count && a.root == b.root &&
         a.peer == b.peer && a.divisor == b.divisor;
}

class PlanCache {
 public:
  // `view` as single operations see it; the tuner's ranksTakeTurns is set
  // into both views here.
  PlanCache(std::unique_ptr<Tuner> tuner, RankView view);

  // The prepared plan of one operation; `grouped`: it is one of several
  // collectives merged into one job (no peer reads: a merged plan holds at
  // most one peer-reading operation).
  Result<std::shared_ptr<const PreparedPlan>> planFor(const CollShape& shape, bool grouped);
  // The peer-reading plan of one operation on device buffers inside windows
  // every rank maps (comm/window.h), or null when the operation has none
  // (not AllReduce, AllGather or ReduceScatter; PreMulSum) or its compute
  // steps are not all the GPU's (an integer average divides). The same on
  // every rank: it depends on the shape alone. Peer reads are the point of
  // such windows, and the tuner has no device figures to weigh them by.
  // `oneShot`: an AllReduce of at most kWindowOneShotMaxBytes out of place
  // on the streams, the one-phase plan (buildPeerReadOneShotAllReduce).
  Result<std::shared_ptr<const PreparedPlan>> windowPlanFor(const CollShape& shape, bool oneShot = false);
  // The plan of a group's operations merged (mergePlans), in this order.
  std::shared_ptr<const PreparedPlan> mergedPlanFor(std::vector<std::shared_ptr<const PreparedPlan>> parts);
  // Whether every rank's plan for the shape has only compute steps the GPU
  // runs (deviceStepsCanRun). Builders give ranks different steps (a
  // chain's root divides, its start scales), and a choice that rides on it
  // must be the same on every rank. Built for each rank once per shape.
  Result<bool> deviceStepsRunEverywhere(const CollShape& shape, bool grouped);
  // The tuner's estimate for one operation, in microseconds.
  Result<double> estimateUs(const CollShape& shape) const;

  // Entries kept per cache before it starts over (a program cycling through
  // more shapes than this pays the tuner again, never unbounded memory).
  static constexpr size_t kLimit = 512;

 private:
  struct ShapeHash {
    size_t operator()(const CollShape& s) const;
  };
  struct ShapeEqual {
    bool operator()(const CollShape& a, const CollShape& b) const {
      return sameShapeButPlacement(a, b) && a.disjointBuffers == b.disjointBuffers;
    }
  };
  using Plans = std::unordered_map<CollShape, std::shared_ptr<const PreparedPlan>, ShapeHash, ShapeEqual>;

  std::unique_ptr<Tuner> tuner_;
  RankView view_;
  RankView groupView_;  // view_ without peer reads: a merged plan holds at most one peer-reading op
  Plans plans_;
  Plans groupPlans_;
  Plans windowPlans_, windowOneShotPlans_;  // null entries: no window plan
  std::unordered_map<CollShape, bool, ShapeHash, ShapeEqual> everywhere_, groupEverywhere_;
  // Merged plans keyed by their parts' prepared plans in order; an entry holds
  // those parts, so their addresses stay unique while it lives. (Merging a
  // send and a receive costs ~7000 instructions, ~4x a whole 8-byte
  // AllReduce call.)
  struct Merged {
    std::vector<std::shared_ptr<const PreparedPlan>> parts;
    std::shared_ptr<const PreparedPlan> merged;
  };
  std::map<std::vector<const PreparedPlan*>, Merged> merged_;
};

}  // namespace shoal
