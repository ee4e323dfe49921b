#include "tuner/tuner.h"

#include <strings.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/log.h"
#include "core/params.h"

namespace shoal {
namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// NCCL's algorithm names and the Shoal algorithms they stand for on host memory.
struct NcclAlgoName {
  const char* nccl;
  std::vector<std::string> shoal;
};
const std::vector<NcclAlgoName>& ncclAlgoNames() {
  static const std::vector<NcclAlgoName> names = {
      {"ring", {"ring", "chain", "pairwise", "direct", "p2p"}},
      {"tree", {"recursive_doubling", "chain", "direct", "pairwise", "p2p"}},
      {"collnetdirect", {}}, {"collnetchain", {}}, {"nvls", {}}, {"nvlstree", {}}, {"pat", {}}};
  return names;
}

uint64_t operationBytes(const CollShape& s) { return s.count * dataTypeSize(s.dtype); }

}  // namespace

Result<std::unique_ptr<Tuner>> Tuner::create(const TopologySummary& topo, int minChannels,
                                             int maxChannels) {
  std::unique_ptr<Tuner> t(new Tuner());
  t->topo_ = topo;
  const Params& p = params();
  if (topo.singleProcess) {
    // Loopback: one memcpy per message, no network.
    t->link_ = LinkModel{0.5, 1.0 / 10000.0, 1.0 / 8000.0};
  }
  int lo = static_cast<int>(p.minChannels > 0 ? p.minChannels : (minChannels > 0 ? minChannels : 1));
  int hi = static_cast<int>(p.maxChannels > 0 ? p.maxChannels : (maxChannels > 0 ? maxChannels : 64));
  t->minChannels_ = std::max(1, lo);
  t->maxChannels_ = std::max(t->minChannels_, hi);

  t->forced_ = lower(p.shoalAlgo);
  if (!t->forced_.empty()) {
    bool known = std::any_of(algorithms().begin(), algorithms().end(),
                             [&](const AlgorithmEntry& e) { return t->forced_ == e.name; });
    if (!known) {
      std::string names;
      for (const auto& e : algorithms())
        if (names.find(e.name) == std::string::npos) names += std::string(names.empty() ? "" : ", ") + e.name;
      return invalidArgument("SHOAL_ALGO=", p.shoalAlgo, " is not an algorithm (known: ", names, ")");
    }
  }
  std::string algo = lower(p.algo);
  if (!algo.empty()) {
    t->allowListNegated_ = algo[0] == '^';
    if (t->allowListNegated_) algo.erase(0, 1);
    size_t pos = 0;
    while (pos <= algo.size()) {
      size_t comma = algo.find_first_of(",;", pos);
      std::string name = algo.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      pos = comma == std::string::npos ? algo.size() + 1 : comma + 1;
      if (auto colon = name.find(':'); colon != std::string::npos) name = name.substr(colon + 1);
      if (name.empty()) continue;
      auto it = std::find_if(ncclAlgoNames().begin(), ncclAlgoNames().end(),
                             [&](const NcclAlgoName& n) { return name == n.nccl; });
      if (it == ncclAlgoNames().end())
        return invalidArgument("NCCL_ALGO=", p.algo, ": unknown algorithm '", name,
                               "' (known: Ring, Tree, CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT)");
      t->allowList_.insert(t->allowList_.end(), it->shoal.begin(), it->shoal.end());
    }
  }
  return t;
}

bool Tuner::allowed(const AlgorithmEntry& entry) const {
  if (allowList_.empty()) return true;
  bool listed = std::find(allowList_.begin(), allowList_.end(), entry.name) != allowList_.end();
  return allowListNegated_ ? !listed : listed;
}

Result<TunerChoice> Tuner::choose(const CollShape& shape, const RankView& view) const {
  TunerChoice choice;
  const Params& p = params();
  uint64_t bytes = operationBytes(shape);
  // Channels stripe large operations; small ones stay on one lane.
  int channels = bytes >= (4u << 20) ? 2 : 1;
  choice.params.channels = std::clamp(channels, minChannels_, maxChannels_);
  choice.params.segmentBytes = p.segmentBytes > 0 ? static_cast<uint64_t>(p.segmentBytes)
                                                  : (topo_.singleProcess ? (4u << 20) : (1u << 20));
  CostParams cost{link_.alphaUs, link_.betaUsPerByte, link_.gammaUsPerByte};
  TransportCaps caps;

  auto all = candidates(shape.kind);
  if (!forced_.empty()) {
    for (const AlgorithmEntry* e : all)
      if (forced_ == e->name && e->supports(shape, view, caps)) choice.algorithm = e;
  }
  if (!choice.algorithm) {
    double best = 0;
    for (int pass = 0; pass < 2 && !choice.algorithm; ++pass) {
      for (const AlgorithmEntry* e : all) {
        if (!e->supports(shape, view, caps)) continue;
        if (pass == 0 && !allowed(*e)) continue;  // pass 1: the allow list left nothing
        double estimate = e->estimate(shape, view, cost);
        if (!choice.algorithm || estimate < best) {
          choice.algorithm = e;
          best = estimate;
        }
      }
    }
  }
  if (!choice.algorithm)
    return internalError("no algorithm supports ", collKindName(shape.kind), " of ", bytes, " bytes");
  int bucket = bytes == 0 ? 0 : 1 + static_cast<int>(std::log2(static_cast<double>(bytes)));
  {
    std::lock_guard<std::mutex> lock(logMutex_);
    if (logged_.emplace(static_cast<int>(shape.kind), bucket).second)
      SHOAL_INFO(subsys::kTuning, collKindName(shape.kind), " ", bytes, " bytes: algorithm ",
                 choice.algorithm->name, ", ", choice.params.channels, " channel(s), segment ",
                 choice.params.segmentBytes, " bytes");
  }
  return choice;
}

Result<double> Tuner::estimateUs(const CollShape& shape, const RankView& view) const {
  SHOAL_ASSIGN_OR_RETURN(TunerChoice choice, choose(shape, view));
  CostParams cost{link_.alphaUs, link_.betaUsPerByte, link_.gammaUsPerByte};
  return choice.algorithm->estimate(shape, view, cost);
}

}  // namespace shoal
