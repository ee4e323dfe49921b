// Tuner: chooses the algorithm, channels and segment size for an operation.
//
// Role: a pure function of (operation shape, topology summary) using each
// algorithm's alpha-beta-gamma estimate from collectives/registry.h; the
// cheapest supported algorithm wins. NCCL_ALGO and SHOAL_ALGO are parsed once at
// creation (a bad name is an error) and restrict or force the choice. Each
// decision is logged once per (collective, size bucket) at INFO TUNING.
// Thread-safety: choose() is const apart from the log-once set (locked).
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "collectives/plan.h"
#include "collectives/registry.h"
#include "core/status.h"
#include "topology/topology.h"

namespace shoal {

// Link costs per transport class, microseconds and microseconds per byte.
struct LinkModel {
  double alphaUs = 10.0;      // per message
  double betaUsPerByte = 1.0 / 1500.0;   // 1.5 GB/s
  double gammaUsPerByte = 1.0 / 8000.0;  // reduction, 8 GB/s
};

struct TunerChoice {
  const AlgorithmEntry* algorithm = nullptr;
  AlgoParams params;
};

struct TopologySummary {
  int nranks = 1;
  int nnodes = 1;
  bool singleProcess = false;  // every rank in this process (loopback)
};

class Tuner {
 public:
  static Result<std::unique_ptr<Tuner>> create(const TopologySummary& topo, int minChannels,
                                               int maxChannels);
  Result<TunerChoice> choose(const CollShape& shape, const RankView& view) const;
  // The chosen algorithm's estimated time in microseconds.
  Result<double> estimateUs(const CollShape& shape, const RankView& view) const;

 private:
  Tuner() = default;
  bool allowed(const AlgorithmEntry& entry) const;

  TopologySummary topo_;
  LinkModel link_;
  int minChannels_ = 1;
  int maxChannels_ = 1;
  std::string forced_;                 // SHOAL_ALGO
  std::vector<std::string> allowList_; // from NCCL_ALGO (lower-case Shoal names)
  bool allowListNegated_ = false;
  mutable std::mutex logMutex_;
  mutable std::set<std::pair<int, int>> logged_;
};

}  // namespace shoal
