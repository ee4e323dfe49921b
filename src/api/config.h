// ncclConfig_t parsing exactly as NCCL 2.30's parseCommConfig does it:
// clamp the caller's size to ours, check the magic, reset every field newer
// than the caller's version to its default, validate, apply env overrides.
#pragma once

#include <nccl.h>

#include "comm/communicator.h"
#include "core/status.h"

namespace shoal::api {

// The caller's config resolved: UNDEF fields replaced by defaults. NULL means
// all defaults.
Result<ncclConfig_t> resolveConfig(const ncclConfig_t* config);
// resolveConfig, then the fields Shoal uses.
Result<CommOptions> parseConfig(const ncclConfig_t* config);

}  // namespace shoal::api
