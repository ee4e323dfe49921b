#include "api/config.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/log.h"
#include "core/params.h"

namespace shoal::api {
namespace {

constexpr int kMaxChannels = 64;  // NCCL's MAXCHANNELS since 2.25

// Resets the fields a caller built with header `version` cannot know about.
void resetNewerFields(ncclConfig_t& c, unsigned version) {
  const int undef = NCCL_CONFIG_UNDEF_INT;
  if (version < NCCL_VERSION(2, 14, 0)) c.blocking = undef;
  if (version < NCCL_VERSION(2, 17, 0)) {
    c.cgaClusterSize = c.minCTAs = c.maxCTAs = undef;
    c.netName = nullptr;
  }
  if (version < NCCL_VERSION(2, 18, 0)) c.splitShare = undef;
  if (version < NCCL_VERSION(2, 25, 0)) c.trafficClass = undef;
  if (version < NCCL_VERSION(2, 27, 0)) {
    c.commName = nullptr;
    c.collnetEnable = c.CTAPolicy = c.shrinkShare = c.nvlsCTAs = undef;
  }
  if (version < NCCL_VERSION(2, 28, 0)) c.nChannelsPerNetPeer = c.nvlinkCentricSched = undef;
  if (version < NCCL_VERSION(2, 29, 0)) c.graphUsageMode = c.numRmaCtx = undef;
  if (version < NCCL_VERSION(2, 30, 0)) c.maxP2pPeers = undef;
  if (version < NCCL_VERSION(2, 30, 5)) c.graphStreamOrdering = undef;
}

void defaultIfUndef(int& field, int value) {
  if (field == NCCL_CONFIG_UNDEF_INT) field = value;
}

}  // namespace

Result<ncclConfig_t> resolveConfig(const ncclConfig_t* config) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  if (config) {
    if (config->magic != NCCL_API_MAGIC)
      return invalidArgument("ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
    size_t size = std::min(config->size, sizeof(ncclConfig_t));
    if (size < offsetof(ncclConfig_t, blocking))
      return invalidArgument("ncclConfig_t size ", config->size, " is too small");
    std::memcpy(&c, config, size);
    resetNewerFields(c, config->version);
    c.size = sizeof(ncclConfig_t);
  }
  // NCCL compares minCTAs with maxCTAs only where the caller set both.
  const bool minCtasSet = c.minCTAs != NCCL_CONFIG_UNDEF_INT, maxCtasSet = c.maxCTAs != NCCL_CONFIG_UNDEF_INT;
  defaultIfUndef(c.blocking, 1);
  defaultIfUndef(c.cgaClusterSize, 0);
  defaultIfUndef(c.minCTAs, 1);
  defaultIfUndef(c.maxCTAs, kMaxChannels);
  defaultIfUndef(c.splitShare, 0);
  defaultIfUndef(c.collnetEnable, 0);
  defaultIfUndef(c.CTAPolicy, NCCL_CTA_POLICY_DEFAULT);
  defaultIfUndef(c.shrinkShare, 0);
  defaultIfUndef(c.nvlinkCentricSched, 0);
  defaultIfUndef(c.graphUsageMode, 2);
  defaultIfUndef(c.numRmaCtx, 1);
  defaultIfUndef(c.graphStreamOrdering, 1);

  // NCCL 2.30's checks (parseCommConfig), each for a field the caller set.
  auto zeroOrOne = [](const char* field, int value) -> Status {
    if (value != 0 && value != 1) return invalidArgument("config.", field, " ", value, " must be 0 or 1");
    return Status::ok();
  };
  auto positiveIfSet = [](const char* field, int value, int most) -> Status {
    if (value != NCCL_CONFIG_UNDEF_INT && (value <= 0 || value > most))
      return invalidArgument("config.", field, " ", value, " must be in 1..", most, " (or left undefined)");
    return Status::ok();
  };
  SHOAL_TRY(zeroOrOne("blocking", c.blocking));
  if (c.minCTAs <= 0 || c.maxCTAs <= 0 || (minCtasSet && maxCtasSet && c.minCTAs > c.maxCTAs))
    return invalidArgument("config.minCTAs ", c.minCTAs, " and maxCTAs ", c.maxCTAs,
                           " must be positive with minCTAs <= maxCTAs");
  // Beyond the channels there are, both are capped, as NCCL caps them.
  for (int* ctas : {&c.minCTAs, &c.maxCTAs})
    if (*ctas > kMaxChannels) {
      SHOAL_INFO(subsys::kInit, "config.", ctas == &c.minCTAs ? "minCTAs " : "maxCTAs ", *ctas,
                 " is more than the ", kMaxChannels, " channels there are: capped at ", kMaxChannels);
      *ctas = kMaxChannels;
    }
  if (c.cgaClusterSize < 0) return invalidArgument("config.cgaClusterSize ", c.cgaClusterSize, " is negative");
  SHOAL_TRY(zeroOrOne("splitShare", c.splitShare));
  SHOAL_TRY(zeroOrOne("collnetEnable", c.collnetEnable));
  // NCCL_CTA_POLICY_* are flags: DEFAULT (0), EFFICIENCY, ZERO, or both.
  constexpr int kAllCtaPolicies = NCCL_CTA_POLICY_DEFAULT | NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO;
  if (c.CTAPolicy < 0 || c.CTAPolicy > kAllCtaPolicies)
    return invalidArgument("config.CTAPolicy ", c.CTAPolicy, " is not a combination of NCCL_CTA_POLICY_* flags");
  SHOAL_TRY(zeroOrOne("shrinkShare", c.shrinkShare));
  SHOAL_TRY(positiveIfSet("nvlsCTAs", c.nvlsCTAs, std::numeric_limits<int>::max()));
  SHOAL_TRY(positiveIfSet("nChannelsPerNetPeer", c.nChannelsPerNetPeer, kMaxChannels));
  SHOAL_TRY(zeroOrOne("nvlinkCentricSched", c.nvlinkCentricSched));
  if (c.graphUsageMode < 0 || c.graphUsageMode > 2)
    return invalidArgument("config.graphUsageMode ", c.graphUsageMode, " must be 0, 1 or 2");
  if (c.numRmaCtx < 0) return invalidArgument("config.numRmaCtx ", c.numRmaCtx, " is negative");
  SHOAL_TRY(positiveIfSet("maxP2pPeers", c.maxP2pPeers, std::numeric_limits<int>::max()));
  SHOAL_TRY(zeroOrOne("graphStreamOrdering", c.graphStreamOrdering));
  if (c.graphStreamOrdering == 0 && c.graphUsageMode == 2) c.graphUsageMode = 1;

  const Params& p = params();
  if (p.commBlocking == 0 || p.commBlocking == 1) c.blocking = static_cast<int>(p.commBlocking);
  return c;
}

Result<CommOptions> parseConfig(const ncclConfig_t* config) {
  SHOAL_ASSIGN_OR_RETURN(ncclConfig_t c, resolveConfig(config));
  CommOptions o;
  o.blocking = c.blocking == 1;
  o.splitShare = c.splitShare;
  // CTAs are GPU thread blocks in NCCL; on host memory they bound our channels.
  if (config && config->minCTAs != NCCL_CONFIG_UNDEF_INT) o.minChannels = c.minCTAs;
  if (config && config->maxCTAs != NCCL_CONFIG_UNDEF_INT) o.maxChannels = c.maxCTAs;
  if (c.netName) o.netName = c.netName;
  if (c.commName) o.commName = c.commName;
  return o;
}

}  // namespace shoal::api
