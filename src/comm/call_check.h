// Cross-rank argument checks (SHOAL_CHECK_MODE=1): see call_check.cc.
#pragma once

#include <span>
#include <string>

#include "comm/communicator.h"
#include "core/status.h"

namespace shoal {

// SHOAL_CHECK_MODE is 1 (or "full").
bool callCheckEnabled();
// Compares the call's (or group's) signature with every rank involved:
// ncclInvalidUsage naming both signatures on any difference. Blocking; runs
// before the call's data moves.
Status checkCallsAgree(Communicator& comm, std::span<const OpRequest> ops);
// "AllReduce(count 4, float, sum)".
std::string describeCall(const CollShape& shape);

}  // namespace shoal
