#include "tuner/tuner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

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
      {"tree", {"recursive_doubling", "bruck", "one_shot", "chain", "direct", "pairwise", "p2p"}},
      {"collnetdirect", {}}, {"collnetchain", {}}, {"nvls", {}}, {"nvlstree", {}}, {"pat", {}}};
  return names;
}

uint64_t operationBytes(const CollShape& s) { return s.count * dataTypeSize(s.dtype); }

// The non-empty pieces of `text` between `delimiter`s.
std::vector<std::string> splitOn(const std::string& text, char delimiter) {
  std::vector<std::string> pieces;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find(delimiter, pos), text.size());
    if (end > pos) pieces.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return pieces;
}

// Fills what the caller left unset; see TopologySummary.
TopologySummary completeSummary(TopologySummary t) {
  t.nranks = std::max(1, t.nranks);
  t.nnodes = std::clamp(t.nnodes, 1, t.nranks);
  if (t.maxRanksPerNode <= 0) t.maxRanksPerNode = (t.nranks + t.nnodes - 1) / t.nnodes;
  if (t.minRanksPerNode <= 0) t.minRanksPerNode = std::max(1, t.nranks / t.nnodes);
  if (!t.intraNode) t.intraNode = t.singleProcess ? LinkClass::kLoopback : LinkClass::kShm;
  if (!t.interNode) t.interNode = t.singleProcess ? LinkClass::kLoopback : LinkClass::kNet;
  if (!t.machine) t.machine = localMachine();
  return t;
}

std::vector<int> channelCandidates(int lo, int hi) {
  std::vector<int> out{lo};
  for (int c = 1; c <= hi; c *= 2)
    if (c > lo) out.push_back(c);
  return out;
}

// Largest first: ties keep the larger segment (fewer messages).
std::vector<uint64_t> segmentCandidates(const TunerOptions& o) {
  if (o.segmentBytes > 0) return {o.segmentBytes};
  std::vector<uint64_t> out;
  for (uint64_t s = o.maxSegmentBytes; s >= o.minSegmentBytes && s > 0; s /= 2) out.push_back(s);
  if (out.empty()) out.push_back(std::max<uint64_t>(1, o.maxSegmentBytes));
  return out;
}

// The candidates for net through kernel sockets, unless forced: without
// kSocketPieceStallBytes (messages of exactly that size stall there,
// cost_model.h) and with the largest piece whose sends are credited with
// leaving from cache (kSocketPieceMaxBytes), in order, where in range.
std::vector<uint64_t> withSocketPiece(std::vector<uint64_t> candidates, const TunerOptions& o) {
  const uint64_t piece = kSocketPieceMaxBytes;
  if (o.segmentBytes > 0) return candidates;
  if (candidates.size() > 1) std::erase(candidates, kSocketPieceStallBytes);
  if (piece < o.minSegmentBytes || piece > o.maxSegmentBytes) return candidates;
  if (std::find(candidates.begin(), candidates.end(), piece) != candidates.end()) return candidates;
  candidates.insert(std::find_if(candidates.begin(), candidates.end(), [&](uint64_t s) { return s < piece; }),
                    piece);
  return candidates;
}

// Whether the network between nodes is libfabric over kernel sockets, whose
// messages cost kSocketProviderMessageUs more (cost_model.h).
bool socketProviderMessages(const TopologySummary& s) { return s.netCpuCopies && s.netEmulatedOverSockets; }

// "a\nb\n" -> "a; b": log lines stay single lines.
std::string oneLine(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  for (size_t nl; (nl = text.find('\n')) != std::string::npos;) text.replace(nl, 1, "; ");
  return text;
}

bool cheaper(double candidate, double best) { return candidate < best * (1.0 - kMinGain); }

}  // namespace

Result<TunerOptions> tunerOptionsFromEnvironment(int minChannels, int maxChannels) {
  const Params& p = params();
  TunerOptions o;
  o.algo = p.algo;
  o.shoalAlgo = p.shoalAlgo;
  if (p.minChannels > 0) o.minChannels = static_cast<int>(p.minChannels);
  else if (minChannels > 0) o.minChannels = minChannels;
  if (p.maxChannels > 0) o.maxChannels = static_cast<int>(p.maxChannels);
  else if (maxChannels > 0) o.maxChannels = maxChannels;
  if (p.segmentBytes > 0) o.segmentBytes = static_cast<uint64_t>(p.segmentBytes);
  if (p.buffSize > 0) o.maxSegmentBytes = static_cast<uint64_t>(p.buffSize);
  if (!p.tunerFile.empty()) {
    SHOAL_ASSIGN_OR_RETURN(o.links, loadLinkTableFile(p.tunerFile, o.links));
  }
  return o;
}

Result<std::unique_ptr<Tuner>> Tuner::create(const TopologySummary& topo, int minChannels,
                                             int maxChannels) {
  SHOAL_ASSIGN_OR_RETURN(TunerOptions options, tunerOptionsFromEnvironment(minChannels, maxChannels));
  return create(topo, std::move(options));
}

Result<std::unique_ptr<Tuner>> Tuner::create(const TopologySummary& topo, TunerOptions options) {
  std::unique_ptr<Tuner> t(new Tuner());
  t->topo_ = completeSummary(topo);
  options.minChannels = std::max(1, options.minChannels);
  options.maxChannels = std::max(options.minChannels, options.maxChannels);
  t->options_ = std::move(options);
  const TunerOptions& o = t->options_;
  t->channelCandidates_ = channelCandidates(o.minChannels, o.maxChannels);
  t->segmentCandidates_ = segmentCandidates(o);
  t->socketSegmentCandidates_ = withSocketPiece(t->segmentCandidates_, o);

  t->forced_ = lower(o.shoalAlgo);
  if (!t->forced_.empty()) {
    bool known = std::any_of(algorithms().begin(), algorithms().end(),
                             [&](const AlgorithmEntry& e) { return t->forced_ == e.name; });
    if (!known) {
      std::string names;
      for (const auto& e : algorithms())
        if (names.find(e.name) == std::string::npos) names += std::string(names.empty() ? "" : ", ") + e.name;
      return invalidArgument("SHOAL_ALGO=", o.shoalAlgo, " is not an algorithm (known: ", names, ")");
    }
  }
  SHOAL_TRY(t->parseAlgoList(o.algo));
  const TopologySummary& s = t->topo_;
  SHOAL_INFO(subsys::kTuning, "tuner: ", s.nranks, " ranks on ", s.nnodes, " node(s), ",
             s.minRanksPerNode, "-", s.maxRanksPerNode, " per node, inside ",
             linkClassName(*s.intraNode), ", across ", linkClassName(*s.interNode),
             s.netTransport.empty()
                 ? ""
                 : str(" (", s.netTransport, s.netCpuCopies ? ", bytes through the CPU" : "",
                       socketProviderMessages(s) ? str(", ", kSocketProviderMessageUs, " us more per message") : "",
                       ")"),
             ", machine ",
             describeMachine(*s.machine), "; links (class alpha_us beta_GBps gamma_GBps): ",
             oneLine(formatLinkTable(o.links)));
  return t;
}

void Tuner::warnForcedMissing(CollKind kind) const {
  std::lock_guard<std::mutex> lock(logMutex_);
  if (forcedMissingWarned_.insert(static_cast<int>(kind)).second)
    SHOAL_WARN("SHOAL_ALGO=", forced_, " has no ", collKindName(kind),
               " algorithm: the tuner chooses one for ", collKindName(kind));
}

// NCCL's syntax: entries split by ';', each a comma-separated list of
// algorithms, '^' first to exclude them; the first entry may apply to every
// collective, the others name theirs ("ring;allreduce:^tree"). A later entry
// for a collective replaces what an earlier one said of it. Negation is of
// NCCL's names: "^tree" leaves Ring, whose Shoal algorithms stay allowed
// even where Tree's list names them too. NCCL applies the list to Broadcast,
// Reduce, AllGather, ReduceScatter and AllReduce only.
Status Tuner::parseAlgoList(const std::string& text) {
  const std::string spec = lower(text);
  if (spec.empty()) return Status::ok();
  static constexpr CollKind kListed[] = {CollKind::kBroadcast, CollKind::kReduce, CollKind::kAllGather,
                                         CollKind::kReduceScatter, CollKind::kAllReduce};
  const auto& names = ncclAlgoNames();
  bool first = true;
  for (std::string entry : splitOn(spec, ';')) {
    std::vector<CollKind> kinds(std::begin(kListed), std::end(kListed));
    if (const size_t colon = entry.find(':'); colon != std::string::npos) {
      const std::string function = entry.substr(0, colon);
      entry = entry.substr(colon + 1);
      auto it = std::find_if(std::begin(kListed), std::end(kListed),
                             [&](CollKind k) { return lower(collKindName(k)) == function; });
      if (it == std::end(kListed))
        return invalidArgument("NCCL_ALGO=", text, ": '", function,
                               "' is not a collective NCCL_ALGO applies to (Broadcast, Reduce, AllGather, "
                               "ReduceScatter, AllReduce)");
      kinds = {*it};
    } else if (!first) {
      return invalidArgument("NCCL_ALGO=", text, ": every entry but the first must name its collective (\"", entry,
                             "\" does not)");
    }
    first = false;
    const bool exclude = !entry.empty() && entry[0] == '^';
    if (exclude) entry.erase(0, 1);
    std::vector<bool> enabled(names.size(), exclude);
    for (const std::string& name : splitOn(entry, ',')) {
      auto it = std::find_if(names.begin(), names.end(), [&](const NcclAlgoName& n) { return name == n.nccl; });
      if (it == names.end())
        return invalidArgument("NCCL_ALGO=", text, ": unknown algorithm '", name,
                               "' (known: Ring, Tree, CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT)");
      enabled[static_cast<size_t>(it - names.begin())] = !exclude;
    }
    // A Shoal algorithm stays if an enabled NCCL name stands for it, or, in
    // an exclusion, if no NCCL name does (hierarchical, peer_read): "^nvls"
    // takes nothing away, as in NCCL.
    std::set<std::string> shoal;
    for (const AlgorithmEntry& a : algorithms()) {
      bool owned = false, kept = false;
      for (size_t i = 0; i < names.size(); ++i) {
        if (std::find(names[i].shoal.begin(), names[i].shoal.end(), a.name) == names[i].shoal.end()) continue;
        owned = true;
        kept = kept || enabled[i];
      }
      if (kept || (exclude && !owned)) shoal.insert(a.name);
    }
    for (CollKind k : kinds) allowed_[static_cast<size_t>(k)] = shoal;
  }
  return Status::ok();
}

bool Tuner::allowed(const AlgorithmEntry& entry) const {
  const auto& list = allowed_[static_cast<size_t>(entry.kind)];
  return !list || list->count(entry.name) > 0;
}

// Algorithms are charged at the slowest link of the communicator: the
// network when there are several nodes, else the link inside the node.
// Estimates that know which rounds or phases stay inside a node price them
// with the node's link through the intra scales.
ModelContext Tuner::contextFor(const AlgorithmEntry& entry, const RankView& view) const {
  const TopologySummary& s = topo_;
  LinkClass crossed = *s.intraNode;
  if (s.nnodes > 1) crossed = s.maxRanksPerNode > 1 ? slower(*s.intraNode, *s.interNode) : *s.interNode;
  const MachineTopology& m = *s.machine;
  ModelContext ctx;
  ctx.link = linkFor(options_.links, crossed);
  ctx.copyLink = crossed != LinkClass::kNet;
  if (s.nnodes > 1 && crossed != *s.intraNode) {
    const LinkModel& inside = linkFor(options_.links, *s.intraNode);
    ctx.intraAlphaScale = std::min(1.0, inside.alphaUs / ctx.link.alphaUs);
    ctx.intraBetaScale = std::min(1.0, inside.betaUsPerByte / ctx.link.betaUsPerByte);
  }
  // Measured for Shoal's tcp transport (decision 0006) and libfabric's tcp
  // provider once its channels kept to their own lanes (0007); other socket
  // providers are assumed alike; a NIC that moves the bytes has no copy to
  // save.
  ctx.netSendsFromCache = !ctx.copyLink && s.netCpuCopies;
  // libfabric's socket providers make more system calls per message than the
  // tcp transport the net row was measured with (cost_model.h).
  if (!ctx.copyLink && socketProviderMessages(s)) ctx.netMessageSurchargeUs = kSocketProviderMessageUs;
  ctx.streams = ctx.copyLink ? 1 : std::clamp(m.cores / s.maxRanksPerNode, 1, kMaxNetStreams);
  // Data from the network counts only the core's own L2 (cost_model.h).
  ctx.cacheShareBytes =
      ctx.copyLink ? std::max<uint64_t>(m.l2Bytes, m.l3Bytes * static_cast<uint64_t>(std::max(1, m.l3Count)) /
                                                       static_cast<uint64_t>(s.maxRanksPerNode))
                   : m.l2Bytes;
  ctx.waitUs = ranksTakeTurns() ? kOversubscribedWaitUs : 0.0;
  if (ctx.copyLink && ranksTakeTurns()) {
    // Every rank's thread copies and reduces its own bytes; when ranks
    // outnumber cores they take turns on them, so each gets cores / ranks
    // of a core's speed.
    double share = static_cast<double>(s.maxRanksPerNode) / std::max(1, m.cores);
    ctx.link.betaUsPerByte *= share;
    ctx.link.gammaUsPerByte *= share;
  }
  // A chain's estimate assumes infinitely fine pipelining; the model adds its fill.
  ctx.pipelineHops = std::string_view(entry.name) == "chain" ? std::max(1, view.nranks - 1) : 1;
  return ctx;
}

std::pair<AlgoParams, double> Tuner::bestParams(const AlgorithmEntry& entry, const CollShape& shape,
                                                const RankView& view) const {
  const ModelContext ctx = contextFor(entry, view);
  AlgoParams best;
  double bestCost = 0;
  bool first = true;
  for (int channels : channelCandidates_) {
    CollShape part = shape;
    part.count = (shape.count + static_cast<uint64_t>(channels) - 1) / static_cast<uint64_t>(channels);
    const AlgorithmTerms terms = decompose(entry, part, view, ctx);
    for (uint64_t segment : ctx.netSendsFromCache ? socketSegmentCandidates_ : segmentCandidates_) {
      double cost = candidateCostUs(terms, ctx, Candidate{channels, segment});
      if (first || cheaper(cost, bestCost)) {
        best = AlgoParams{channels, segment};
        bestCost = cost;
        first = false;
      }
    }
  }
  return {best, bestCost};
}

Result<std::pair<TunerChoice, double>> Tuner::decide(const CollShape& shape,
                                                     const RankView& view) const {
  TunerChoice choice;
  double best = 0;
  auto consider = [&](const AlgorithmEntry* e) {
    auto [params, cost] = bestParams(*e, shape, view);
    if (!choice.algorithm || cheaper(cost, best)) {
      choice = TunerChoice{e, params};
      best = cost;
    }
  };
  auto all = candidates(shape.kind);
  const bool pointToPoint = shape.kind == CollKind::kSend || shape.kind == CollKind::kRecv;
  if (!forced_.empty() && !pointToPoint) {
    // A forced algorithm runs where it can, or the call fails (as NCCL fails a
    // call that NCCL_ALGO leaves without an algorithm): a benchmark or test
    // that forces one never measures another.
    bool exists = false;
    for (const AlgorithmEntry* e : all) {
      if (forced_ != e->name) continue;
      exists = true;
      if (e->supports(shape, view)) consider(e);
    }
    if (exists && !choice.algorithm)
      return invalidUsage("SHOAL_ALGO=", forced_, " cannot run ", collKindName(shape.kind), " of ",
                          operationBytes(shape), " bytes on ", view.nranks, " rank(s) of ", topo_.nnodes,
                          " node(s) (it does not apply there); unset SHOAL_ALGO or choose another");
    if (!exists) warnForcedMissing(shape.kind);
  }
  if (!choice.algorithm) {
    for (const AlgorithmEntry* e : all)
      if (allowed(*e) && e->supports(shape, view)) consider(e);
  }
  if (!choice.algorithm && allowed_[static_cast<size_t>(shape.kind)])
    return invalidUsage("no algorithm available for ", collKindName(shape.kind), " of ",
                        operationBytes(shape), " bytes with ", dataTypeName(shape.dtype),
                        ": NCCL_ALGO was set to ", options_.algo);
  if (!choice.algorithm)
    return internalError("no algorithm supports ", collKindName(shape.kind), " of ",
                         operationBytes(shape), " bytes");
  return std::make_pair(choice, best);
}

Result<TunerChoice> Tuner::choose(const CollShape& shape, const RankView& view) const {
  SHOAL_ASSIGN_OR_RETURN(auto decision, decide(shape, view));
  const auto& [choice, costUs] = decision;
  const uint64_t bytes = operationBytes(shape);
  int bucket = bytes == 0 ? 0 : 1 + static_cast<int>(std::log2(static_cast<double>(bytes)));
  {
    std::lock_guard<std::mutex> lock(logMutex_);
    if (logged_.emplace(static_cast<int>(shape.kind), bucket).second)
      SHOAL_INFO(subsys::kTuning, collKindName(shape.kind), " ", bytes, " bytes: algorithm ",
                 choice.algorithm->name, ", ", choice.params.channels, " channel(s), segment ",
                 choice.params.segmentBytes, " bytes (model ", costUs, " us)");
  }
  return choice;
}

Result<double> Tuner::estimateUs(const CollShape& shape, const RankView& view) const {
  SHOAL_ASSIGN_OR_RETURN(auto decision, decide(shape, view));
  return decision.second;
}

}  // namespace shoal
