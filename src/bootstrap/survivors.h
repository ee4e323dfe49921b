// The survivors' agreement of ncclCommShrink (docs/nccl-compat.md, Elastic
// communicators).
//
// Role: the ranks that call ncclCommShrink must agree on who is excluded
// before they make the new communicator, and they must do it without the
// excluded ranks, which may be dead (SIGKILLed, or behind a link that went
// down): nothing here talks to a peer directly. Each survivor posts its own
// exclude list in the parent's store under a prefix only this shrink uses
// (the parent's id and a shrink count), then reads the lists of the ranks it
// believes survive. A list that differs from its own fails the agreement at
// once with both lists in the message, rather than leaving two groups waiting
// for each other until their deadline. Thread: the caller's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"

namespace shoal {

struct SurvivorAgreement {
  std::vector<int> survivors;  // parent ranks, in order: the new ranks' order
  int newRank = -1;            // this rank's place among them
  std::string scope;           // the new communicator's scope in the store
};

// `excluded`: sorted, unique, in [0, parentSize), not containing parentRank.
// `prefix`: unique to this shrink of this parent (e.g. "e<id>/shrink<k>").
// Waits (polling the store, no rank contacted) until every survivor's list is
// there or the deadline passes; the error then names the survivors that never
// posted one. `goneKeys` (by parent rank; empty: none) are where the root
// writes the parent's ranks' wills (Bootstrap::goneKey): once a second the
// wait looks at those of the survivors still missing, and one whose process
// ended fails it at once (kRemoteError naming it: exclude it too).
Result<SurvivorAgreement> agreeOnSurvivors(Store& store, const std::string& prefix, int parentRank,
                                           int parentSize, const std::vector<int>& excluded,
                                           const std::vector<std::string>& goneKeys, Deadline deadline);
// Removes this rank's posted list; call once the new communicator is made
// (every survivor has read it by then).
void forgetSurvivorList(Store& store, const std::string& prefix, int parentRank);
// Whether the shrink at `prefix` was agreed on by the other ranks with
// `parentRank` excluded: a rank left out of a shrink but alive (the parent
// keeps working after NCCL_SHRINK_DEFAULT) never took that shrink's count,
// and skips it at its next shrink, as the survivors did. Each agreement
// leaves that record (a few bytes per shrink, with the parent's other keys).
// False where the store does not answer by the deadline.
bool excludedFromShrink(Store& store, const std::string& prefix, int parentRank, Deadline deadline);

// "{1, 3}" for messages.
std::string rankListText(const std::vector<int>& ranks);

}  // namespace shoal
