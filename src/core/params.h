// Parameters: the one registry of tunables (docs/design.md, Parameters and logging).
//
// Role: every environment variable Shoal reads is declared once in params.def.
// No other code calls getenv. Values are read from the environment (and from
// NCCL_CONF_FILE, ~/.nccl.conf or /etc/nccl.conf, where the environment is silent)
// the first time params() is called; tests may reload with reloadParams().
// Thread-safety: params() returns a snapshot that is never mutated or freed
// after load; reloadParams() (tests, ncclResetDebugInit) makes a new one,
// which later calls see, and keeps the old one for whoever still reads it.
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
  std::string source;  // "default", "environment" or "config file <path>"
};

// An NCCL variable NVIDIA documents and Shoal does not honour (unhonoured.def).
struct UnhonouredInfo {
  const char* env;
  bool warn;           // logged at WARN (a user may rely on it), else INFO ENV
  const char* reason;
  std::string value;   // as set ("" when unset)
  bool isSet;
  std::string source;  // "environment" or "config file <path>" when set
};

const Params& params();
// SHOAL_HANDSHAKE_TIMEOUT_MS as every handshake waits for it: 0 or less is
// the default (an unauthenticated peer is never waited for without end).
int64_t handshakeTimeoutMs();
// Re-reads the environment; for tests (not thread-safe).
void reloadParams();
// Every declared parameter, in declaration order, with its current setting.
std::vector<ParamInfo> describeParams();
// Every unhonoured NCCL variable, in declaration order, with its setting.
std::vector<UnhonouredInfo> describeUnhonoured();
// Logs one line per unhonoured variable that is set, once per process
// (communicator init calls it).
void logUnhonouredOnce();
// Markdown table of every parameter and unhonoured variable (docs/env.md).
std::string paramsMarkdown();

}  // namespace shoal
