#include "comm/plan_cache.h"

#include <utility>

#include "collectives/builders.h"

namespace shoal {

PlanCache::PlanCache(std::unique_ptr<Tuner> tuner, RankView view) : tuner_(std::move(tuner)), view_(std::move(view)) {
  view_.ranksTakeTurns = tuner_->ranksTakeTurns();
  groupView_ = view_;
  groupView_.peerReads = false;
}

size_t PlanCache::ShapeHash::operator()(const CollShape& s) const {
  uint64_t h = s.count * 0x9e3779b97f4a7c15ull;
  h ^= (static_cast<uint64_t>(s.kind) << 8 | static_cast<uint64_t>(s.dtype) << 16 |
        static_cast<uint64_t>(s.op) << 24) + (h << 6) + (h >> 2);
  h ^= (static_cast<uint64_t>(static_cast<uint32_t>(s.root)) << 32 | static_cast<uint32_t>(s.peer)) + (h << 6);
  h ^= s.divisor + (static_cast<uint64_t>(s.disjointBuffers) << 40) + (h << 6) + (h >> 2);
  return static_cast<size_t>(h);
}

Result<std::shared_ptr<const PreparedPlan>> PlanCache::planFor(const CollShape& shape, bool grouped) {
  Plans& cache = grouped ? groupPlans_ : plans_;
  const RankView& view = grouped ? groupView_ : view_;
  auto it = cache.find(shape);
  if (it != cache.end()) return it->second;
  SHOAL_ASSIGN_OR_RETURN(TunerChoice choice, tuner_->choose(shape, view));
  auto prepared = preparePlan(std::make_shared<Plan>(choice.algorithm->build(shape, view, choice.params)));
  if (cache.size() >= kLimit) cache.clear();
  cache.emplace(shape, prepared);
  return prepared;
}

Result<std::shared_ptr<const PreparedPlan>> PlanCache::windowPlanFor(const CollShape& shape, bool oneShot) {
  oneShot = oneShot && shape.kind == CollKind::kAllReduce;  // the one-phase plan is an AllReduce's
  Plans& cache = oneShot ? windowOneShotPlans_ : windowPlans_;
  auto it = cache.find(shape);
  if (it != cache.end()) return it->second;
  RankView view = view_;
  view.peerReads = true;
  view.deviceMemory = true;
  std::shared_ptr<const PreparedPlan> prepared;
  const AlgorithmEntry* peerRead = findAlgorithm(shape.kind, "peer_read");
  if (peerRead && peerRead->supports(shape, view)) {
    auto plan = std::make_shared<Plan>(oneShot ? buildPeerReadOneShotAllReduce(shape, view, AlgoParams{})
                                               : peerRead->build(shape, view, AlgoParams{}));
    if (computeStepsRunOnDevice(*plan)) prepared = preparePlan(std::move(plan));
  }
  if (cache.size() >= kLimit) cache.clear();
  cache.emplace(shape, prepared);
  return prepared;
}

Result<bool> PlanCache::deviceStepsRunEverywhere(const CollShape& shape, bool grouped) {
  auto& cache = grouped ? groupEverywhere_ : everywhere_;
  auto it = cache.find(shape);
  if (it != cache.end()) return it->second;
  SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<const PreparedPlan> own, planFor(shape, grouped));
  bool everywhere = own->deviceStepsCanRun;
  // A Send's or Recv's plan is one message: its peer's is the mirror.
  if (everywhere && shape.kind != CollKind::kSend && shape.kind != CollKind::kRecv) {
    RankView view = grouped ? groupView_ : view_;
    SHOAL_ASSIGN_OR_RETURN(TunerChoice choice, tuner_->choose(shape, view));
    for (int r = 0; everywhere && r < view.nranks; ++r) {
      if (r == view.rank) continue;
      RankView other = view;
      other.rank = r;
      everywhere = deviceStepsCanRun(choice.algorithm->build(shape, other, choice.params));
    }
  }
  if (cache.size() >= kLimit) cache.clear();
  cache.emplace(shape, everywhere);
  return everywhere;
}

std::shared_ptr<const PreparedPlan> PlanCache::mergedPlanFor(std::vector<std::shared_ptr<const PreparedPlan>> parts) {
  std::vector<const PreparedPlan*> key;
  key.reserve(parts.size());
  for (const auto& part : parts) key.push_back(part.get());
  auto it = merged_.find(key);
  if (it != merged_.end()) return it->second.merged;
  std::vector<PlanPtr> plans;
  plans.reserve(parts.size());
  for (const auto& part : parts) plans.push_back(part->plan);
  auto merged = preparePlan(std::make_shared<Plan>(mergePlans(plans)));
  if (merged_.size() >= kLimit) merged_.clear();
  merged_.emplace(std::move(key), Merged{std::move(parts), merged});
  return merged;
}

Result<double> PlanCache::estimateUs(const CollShape& shape) const { return tuner_->estimateUs(shape, view_); }

}  // namespace shoal
