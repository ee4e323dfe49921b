#include "bootstrap/survivors.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/log.h"

namespace shoal {
namespace {

// How often a survivor looks for the lists still missing: soon after a list
// arrived, then less often while none does, up to kPollMaxMs. The lists
// arrive within the time the survivors take to notice a failure and call
// shrink, which differs by up to an idle check interval; every look is one
// request per survivor to the one root, which thousands of survivors
// polling every 10 ms would swamp.
constexpr int64_t kPollMs = 10;
constexpr int64_t kPollMaxMs = 200;
// How often it looks for the wills of the survivors still missing.
constexpr int64_t kGoneLookMs = 1000;

std::string listKey(const std::string& prefix, int parentRank) {
  return str(prefix, "/excluded/", parentRank);
}

// The agreed exclude list of a shrink, left for the ranks it excluded.
std::string agreedKey(const std::string& prefix) { return str(prefix, "/agreed"); }

std::string encodeList(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += str(out.empty() ? "" : ",", r);
  return out;
}

// A survivor still missing whose process ended (its will is written): the
// wait would last until the deadline.
Status lookForGoneSurvivors(Store& store, const std::vector<int>& missing, const std::vector<std::string>& goneKeys,
                            const std::vector<int>& excluded, Deadline deadline) {
  std::vector<std::string> keys;
  for (int r : missing) keys.push_back(goneKeys[static_cast<size_t>(r)]);
  Result<std::optional<Store::Found>> will = store.firstPresent(keys, deadline);
  if (!will.isOk() || !will.value()) return Status::ok();  // a store error: the next poll says what is wrong
  const int gone = missing[will.value()->index];
  return remoteError("rank ", gone, " is not excluded but will never call ncclCommShrink: ", will.value()->value,
                     "; this rank excludes ", rankListText(excluded), " (exclude rank ", gone, " too)");
}

}  // namespace

std::string rankListText(const std::vector<int>& ranks) {
  std::string out = "{";
  for (size_t i = 0; i < ranks.size(); ++i) out += str(i ? ", " : "", ranks[i]);
  return out + "}";
}

Result<SurvivorAgreement> agreeOnSurvivors(Store& store, const std::string& prefix, int parentRank,
                                           int parentSize, const std::vector<int>& excluded,
                                           const std::vector<std::string>& goneKeys, Deadline deadline) {
  SurvivorAgreement agreement;
  for (int r = 0; r < parentSize; ++r)
    if (!std::binary_search(excluded.begin(), excluded.end(), r)) agreement.survivors.push_back(r);
  agreement.newRank = static_cast<int>(
      std::find(agreement.survivors.begin(), agreement.survivors.end(), parentRank) - agreement.survivors.begin());
  const std::string mine = encodeList(excluded);
  // The new scope names the surviving set too: survivors that disagree could
  // never meet in one scope, even if their lists were not compared.
  agreement.scope = str(prefix, "/", hex64(fnv1a(mine)));

  SHOAL_TRY(store.set(listKey(prefix, parentRank), mine, deadline))
      << "posting this rank's exclude list through " << store.describe();
  std::vector<int> missing;
  for (int r : agreement.survivors)
    if (r != parentRank) missing.push_back(r);
  int64_t pollMs = kPollMs;
  int64_t nextGoneLookNs = nowNs() + kGoneLookMs * 1000000;
  while (!missing.empty()) {
    std::vector<std::string> keys;
    for (int r : missing) keys.push_back(listKey(prefix, r));
    SHOAL_ASSIGN_OR_RETURN(std::vector<bool> present, store.check(keys, deadline),
                           "reading the survivors' exclude lists through ", store.describe());
    std::vector<std::string> arrived;
    std::vector<int> arrivedRanks, stillMissing;
    for (size_t i = 0; i < missing.size(); ++i) {
      if (present[i]) {
        arrived.push_back(keys[i]);
        arrivedRanks.push_back(missing[i]);
      } else {
        stillMissing.push_back(missing[i]);
      }
    }
    if (!arrived.empty()) {
      SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> lists, store.get(arrived, deadline),
                             "reading the survivors' exclude lists through ", store.describe());
      for (size_t i = 0; i < lists.size(); ++i)
        if (lists[i] != mine)
          return invalidUsage("the surviving ranks disagree on whom to exclude: rank ", parentRank,
                              " excludes {", mine, "} but rank ", arrivedRanks[i], " excludes {", lists[i],
                              "}; every caller must pass the same list");
    }
    missing = std::move(stillMissing);
    if (missing.empty()) break;
    pollMs = arrived.empty() ? std::min(pollMs * 2, kPollMaxMs) : kPollMs;
    if (!goneKeys.empty() && nowNs() >= nextGoneLookNs) {
      SHOAL_TRY(lookForGoneSurvivors(store, missing, goneKeys, excluded, deadline));
      nextGoneLookNs = nowNs() + kGoneLookMs * 1000000;
    }
    if (deadline.expired()) {
      if (deadline.cancelled()) return error(Code::kAborted, "cancelled (ncclCommAbort)");
      return Status(Code::kTimeout,
                    str("ranks ", rankListText(missing),
                        " are not excluded but never called ncclCommShrink (are they dead? exclude them); "
                        "this rank excludes ", rankListText(excluded), " (SHOAL_INIT_TIMEOUT_MS)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(pollMs, deadline.remainingMs() + 1)));
  }
  // Every survivor writes the same record: the first one there makes it.
  SHOAL_TRY(store.set(agreedKey(prefix), mine, deadline))
      << "recording the agreed exclude list through " << store.describe();
  return agreement;
}

bool excludedFromShrink(Store& store, const std::string& prefix, int parentRank, Deadline deadline) {
  Result<std::optional<Store::Found>> agreed = store.firstPresent({agreedKey(prefix)}, deadline);
  if (!agreed.isOk() || !agreed.value()) return false;
  const std::string& list = agreed.value()->value;
  for (size_t at = 0; at < list.size();) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    if (list.compare(at, end - at, std::to_string(parentRank)) == 0) return true;
    at = end + 1;
  }
  return false;
}

void forgetSurvivorList(Store& store, const std::string& prefix, int parentRank) {
  (void)store.erase({listKey(prefix, parentRank)}, Deadline::afterMs(Bootstrap::kLeaveMs));
}

}  // namespace shoal
