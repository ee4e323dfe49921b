// Tuner: chooses the algorithm, channels and segment size for an operation.
//
// Role: a pure function of (operation shape, topology summary, link costs).
// For every supported algorithm of the collective (collectives/registry.h),
// every channel count and every segment size it evaluates the cost model of
// tuner/cost_model.h and keeps the cheapest; a candidate must beat the
// current choice by kMinGain, so ties go to table order, fewer channels and
// larger segments. NCCL_ALGO and SHOAL_ALGO are parsed once at creation (a bad
// name is an error) and restrict or force the algorithm; NCCL_MIN/MAX_NCHANNELS
// and SHOAL_SEGMENT_BYTES bound or force the rest. Each decision is logged
// once per (collective, size bucket) at INFO TUNING.
//
// Every rank of a communicator must reach the same decision, so the inputs
// are global facts only (TopologySummary says which).
// Thread-safety: choose() is const apart from the log-once set (locked).
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "collectives/plan.h"
#include "collectives/registry.h"
#include "core/status.h"
#include "topology/topology.h"
#include "tuner/cost_model.h"

namespace shoal {

struct TunerChoice {
  const AlgorithmEntry* algorithm = nullptr;
  AlgoParams params;
};

struct TunerOptions {
  LinkTable links = builtinLinkTable();
  std::string algo;              // NCCL_ALGO: allow list of NCCL names, ^ negates
  std::string shoalAlgo;         // SHOAL_ALGO: one Shoal algorithm name
  int minChannels = 1;
  int maxChannels = 16;
  uint64_t segmentBytes = 0;     // > 0: forced (SHOAL_SEGMENT_BYTES)
  uint64_t minSegmentBytes = 16 << 10;
  uint64_t maxSegmentBytes = 4 << 20;  // NCCL_BUFFSIZE: scratch per peer and channel
};

// From the parameters (NCCL_ALGO, SHOAL_ALGO, NCCL_MIN/MAX_NCHANNELS,
// SHOAL_SEGMENT_BYTES, NCCL_BUFFSIZE) and SHOAL_TUNER_FILE over the built-in
// link table. minChannels/maxChannels come from the communicator's config
// (<= 0: unset); the environment wins over them. A malformed tuner file is an
// error naming the line.
Result<TunerOptions> tunerOptionsFromEnvironment(int minChannels, int maxChannels);

// A candidate must be this much cheaper to replace the current choice: the
// model is not more accurate than that, and the simpler choice is the safer.
inline constexpr double kMinGain = 0.02;

class Tuner {
 public:
  // tunerOptionsFromEnvironment(minChannels, maxChannels), then create().
  static Result<std::unique_ptr<Tuner>> create(const TopologySummary& topo, int minChannels,
                                               int maxChannels);
  static Result<std::unique_ptr<Tuner>> create(const TopologySummary& topo, TunerOptions options);

  Result<TunerChoice> choose(const CollShape& shape, const RankView& view) const;
  // The chosen candidate's modelled time in microseconds.
  Result<double> estimateUs(const CollShape& shape, const RankView& view) const;

  // The summary with every default filled in (machine included).
  const TopologySummary& summary() const { return topo_; }
  // A node's ranks outnumber the machine's cores: they take turns on them
  // (the model shares a core's speed among them; RankView::ranksTakeTurns).
  bool ranksTakeTurns() const { return topo_.maxRanksPerNode > topo_.machine->cores; }
  const LinkTable& links() const { return options_.links; }

 private:
  Tuner() = default;
  bool allowed(const AlgorithmEntry& entry) const;
  Status parseAlgoList(const std::string& text);  // NCCL_ALGO into allowed_
  ModelContext contextFor(const AlgorithmEntry& entry, const RankView& view) const;
  // The cheapest (channels, segment) for one algorithm, and its cost.
  std::pair<AlgoParams, double> bestParams(const AlgorithmEntry& entry, const CollShape& shape,
                                           const RankView& view) const;
  Result<std::pair<TunerChoice, double>> decide(const CollShape& shape, const RankView& view) const;

  TopologySummary topo_;
  TunerOptions options_;
  std::vector<int> channelCandidates_;
  std::vector<uint64_t> segmentCandidates_;
  // segmentCandidates_ less kSocketPieceStallBytes and with
  // kSocketPieceMaxBytes: for net through kernel sockets.
  std::vector<uint64_t> socketSegmentCandidates_;
  std::string forced_;                 // SHOAL_ALGO, lower case
  // NCCL_ALGO: per collective NCCL applies it to (Broadcast, Reduce,
  // AllGather, ReduceScatter, AllReduce), the Shoal algorithms of the NCCL
  // algorithms it leaves enabled; unset for a collective it leaves alone.
  std::array<std::optional<std::set<std::string>>, kNumCollKinds> allowed_;
  // Collective kinds SHOAL_ALGO names no algorithm of, warned once each.
  mutable std::set<int> forcedMissingWarned_;  // guarded by logMutex_
  void warnForcedMissing(CollKind kind) const;
  mutable std::mutex logMutex_;
  mutable std::set<std::pair<int, int>> logged_;
};

}  // namespace shoal
