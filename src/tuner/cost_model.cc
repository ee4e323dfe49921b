#include "tuner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

namespace shoal {
namespace {

constexpr double kBytesPerUsPerGBps = 1e3;  // 1 GB/s = 1e9 B/s = 1e3 B/us

double usPerByte(double gigabytesPerSecond) { return 1.0 / (gigabytesPerSecond * kBytesPerUsPerGBps); }
double gigabytesPerSecond(double usPerByte) { return 1.0 / (usPerByte * kBytesPerUsPerGBps); }

LinkModel link(double alphaUs, double betaGBps, double gammaGBps) {
  return LinkModel{alphaUs, usPerByte(betaGBps), usPerByte(gammaGBps)};
}

}  // namespace

// Measured with
//   cd /tmp/build-tuner && for i in 1 2 3 4 5; do nice -n 15 ./bench/micro/calibrate_links; done
// on the 2-core development VM (shared with other builds, so noisy), 2026-11-30:
// each figure is the median of the 5 runs (each run reports the median of 5
// repeats). net is tcp through the kernel's loopback path: its alpha is a
// floor and its beta a ceiling for a real NIC; override with SHOAL_TUNER_FILE.
LinkTable builtinLinkTable() {
  LinkTable t;
  t[static_cast<size_t>(LinkClass::kLoopback)] = link(13.89, 10.079, 10.271);
  t[static_cast<size_t>(LinkClass::kShm)] = link(1.04, 4.855, 10.271);
  // net beta: loopback's 3.66 GB/s is a ceiling no NIC path reaches; across
  // the emulated nodes of tests/netns (veth and a bridge) one stream moves
  // 0.66 of what it moves on loopback (sendrecv_perf 16 MiB, 1.45 vs 2.2 GB/s
  // each way, same minutes), so 2.4 GB/s. The tuner's split between flat and
  // hierarchical algorithms rests on this link against shm's.
  t[static_cast<size_t>(LinkClass::kNet)] = link(7.15, 2.4, 10.271);
  return t;
}

Result<LinkTable> parseLinkTable(std::string_view text, std::string_view origin,
                                 const LinkTable& base) {
  LinkTable table = base;
  std::istringstream lines{std::string(text)};
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (size_t hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream fields(line);
    std::string name;
    if (!(fields >> name)) continue;  // blank or comment
    auto fail = [&](auto&&... why) {
      return invalidArgument(origin, " line ", number, ": ", why...,
                             " (expected '<loopback|shm|net> <alpha_us> <beta_GBps> <gamma_GBps>')");
    };
    std::optional<LinkClass> linkClass = parseLinkClass(name);
    if (!linkClass) return fail("unknown link class '", name, "'");
    double alphaUs = 0, betaGBps = 0, gammaGBps = 0;
    if (!(fields >> alphaUs >> betaGBps >> gammaGBps)) return fail("expected three numbers after '", name, "'");
    if (std::string extra; fields >> extra) return fail("unexpected '", extra, "' after the three numbers");
    if (!std::isfinite(alphaUs) || alphaUs < 0) return fail("alpha_us must be >= 0");
    if (!std::isfinite(betaGBps) || betaGBps <= 0) return fail("beta_GBps must be > 0");
    if (!std::isfinite(gammaGBps) || gammaGBps <= 0) return fail("gamma_GBps must be > 0");
    table[static_cast<size_t>(*linkClass)] = link(alphaUs, betaGBps, gammaGBps);
  }
  return table;
}

Result<LinkTable> loadLinkTableFile(const std::string& path, const LinkTable& base) {
  std::ifstream in(path);
  if (!in) return invalidArgument("SHOAL_TUNER_FILE=", path, ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  return parseLinkTable(text.str(), str("SHOAL_TUNER_FILE=", path), base);
}

std::string formatLinkTable(const LinkTable& t) {
  std::string out;
  for (LinkClass c : {LinkClass::kLoopback, LinkClass::kShm, LinkClass::kNet}) {
    const LinkModel& l = linkFor(t, c);
    char line[128];
    std::snprintf(line, sizeof(line), "%-8s %8.3f %8.3f %8.3f\n", linkClassName(c), l.alphaUs,
                  gigabytesPerSecond(l.betaUsPerByte), gigabytesPerSecond(l.gammaUsPerByte));
    out += line;
  }
  return out;
}

AlgorithmTerms decompose(const AlgorithmEntry& algorithm, const CollShape& shape,
                         const RankView& view, const ModelContext& ctx) {
  const double a = ctx.intraAlphaScale, b = ctx.intraBetaScale;
  AlgorithmTerms t;
  t.messages = algorithm.estimate(shape, view, CostParams{1.0, 0.0, 0.0, a, b});
  t.linkBytes = algorithm.estimate(shape, view, CostParams{0.0, 1.0, 0.0, a, b});
  t.reducedBytes = algorithm.estimate(shape, view, CostParams{0.0, 0.0, 1.0, a, b});
  t.waits = algorithm.estimate(shape, view, CostParams{0.0, 0.0, 0.0, a, b, 1.0});
  t.netMessages = ctx.netMessageSurchargeUs > 0 ? algorithm.estimate(shape, view, CostParams{1.0, 0.0, 0.0, 0.0, b})
                                                : 0.0;
  return t;
}

double candidateCostUs(const AlgorithmTerms& perChannel, const ModelContext& ctx,
                       const Candidate& candidate) {
  const double M = perChannel.messages;
  const double B = perChannel.linkBytes;
  const double G = perChannel.reducedBytes;
  const double segment = static_cast<double>(candidate.segmentBytes);
  const bool chain = ctx.pipelineHops > 1;
  const LinkModel& link = ctx.link;
  const double alpha = link.alphaUs + (M > 0 ? (ctx.waitUs * perChannel.waits +
                                                 ctx.netMessageSurchargeUs * perChannel.netMessages) / M
                                              : 0.0);

  // A chain hop forwards the whole part; other algorithms send B/M per message.
  const double messageBytes = chain ? B : (M > 0 ? B / M : 0);
  // Below the half-performance length a message costs its latency whatever
  // its size: splitting it over channels only multiplies messages.
  if (candidate.channels > 1 && messageBytes < link.alphaUs / link.betaUsPerByte)
    return std::numeric_limits<double>::infinity();
  const double pieces = messageBytes > segment ? messageBytes / segment : 1.0;
  const double pieceBytes = messageBytes / pieces;
  const bool cacheResident = kSegmentsInFlight * static_cast<double>(candidate.channels) * pieceBytes <=
                             static_cast<double>(ctx.cacheShareBytes);
  const double cache = cacheResident ? kCacheSpeedup : 1.0;
  // Sends through kernel sockets get the credit only up to kSocketPieceMaxBytes.
  const double sendCache =
      ctx.netSendsFromCache && pieceBytes > static_cast<double>(kSocketPieceMaxBytes) ? 1.0 : cache;
  // Copy links: the rank's thread copies every byte, at cache speed when
  // resident. Net through kernel sockets (netSendsFromCache): bytes reduced
  // and then sent on leave from cache; min(G, B - G) stands for them — exact
  // for the ring AllReduce (the case measured), 0 for algorithms that reduce
  // every byte they send (G = B) or reduce nothing.
  const double bytesSentFromCache = ctx.copyLink            ? B
                                    : ctx.netSendsFromCache ? std::max(0.0, std::min(G, B - G))
                                                            : 0.0;
  const double transferPerByte =
      B > 0 ? link.betaUsPerByte * ((B - bytesSentFromCache) + bytesSentFromCache / sendCache) / B
            : link.betaUsPerByte;
  const double reducePerLinkByte = B > 0 ? G / B * link.gammaUsPerByte / cache : 0.0;

  double channel = 0;
  if (chain) {
    // Every piece crosses every hop; hops work on different pieces at once.
    const double move = pieceBytes * transferPerByte;
    const double reduce = pieceBytes * reducePerLinkByte;
    const double stage = alpha + (ctx.copyLink ? move + reduce : std::max(move, reduce));
    channel = (ctx.pipelineHops - 1 + pieces) * stage;
  } else {
    const double transfer = B * transferPerByte;
    const double reduce = G * link.gammaUsPerByte / cache;
    const double body = ctx.copyLink ? transfer + reduce
                                     : std::max(transfer, reduce) + std::min(transfer, reduce) / pieces;
    channel = M * pieces * alpha + body;
  }
  return channel * std::max(1.0, static_cast<double>(candidate.channels) / std::max(1, ctx.streams));
}

}  // namespace shoal
