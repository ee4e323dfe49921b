// Parameters: the one registry of tunables (docs/design.md, Parameters and logging).
//
// Role: every environment variable Shoal reads is declared once in params.def.
// No other code calls getenv. Values are read from the environment (and from
// NCCL_CONF_FILE, ~/.nccl.conf or /etc/nccl.conf, where the environment is silent)
// the first time params() is called; tests may reload with reloadParams().
// Thread-safety: params() returns a snapshot that is never mutated after load;
// reloadParams() is for single-threaded tests only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shoal {

struct Params {
#define SHOAL_PARAM_Int int64_t
#define SHOAL_PARAM_Str std::string
#define SHOAL_PARAM_Bool bool
#define SHOAL_PARAM(kind, field, env, def, help) SHOAL_PARAM_##kind field;
#include "core/params.def"
#undef SHOAL_PARAM
};

struct ParamInfo {
  const char* env;
  const char* kind;
  const char* defaultValue;
  const char* help;
  std::string value;   // as set ("" when unset)
  bool isSet;
};

const Params& params();
// Re-reads the environment; for tests (not thread-safe).
void reloadParams();
// Every declared parameter, in declaration order, with its current setting.
std::vector<ParamInfo> describeParams();
// Markdown table of every parameter (docs/env.md).
std::string paramsMarkdown();

}  // namespace shoal
