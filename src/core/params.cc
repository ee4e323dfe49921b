#include "core/params.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "core/log.h"

namespace shoal {
namespace {

struct ConfFile {
  std::string path;  // the file read ("" when none exists)
  std::map<std::string, std::string> values;
};

// NCCL_CONF_FILE, then ~/.nccl.conf, then /etc/nccl.conf: VAR=value lines that
// apply where the environment does not set VAR (NCCL's behaviour).
ConfFile readConfFiles() {
  ConfFile conf;
  auto& values = conf.values;
  std::vector<std::string> files;
  if (const char* f = std::getenv("NCCL_CONF_FILE"); f && *f) files.emplace_back(f);
  if (const char* home = std::getenv("HOME"); home && *home)
    files.push_back(std::string(home) + "/.nccl.conf");
  files.emplace_back("/etc/nccl.conf");
  for (const auto& path : files) {
    std::ifstream in(path);
    if (!in) continue;
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      auto eq = line.find('=');
      if (eq == std::string::npos) continue;
      values.emplace(line.substr(0, eq), line.substr(eq + 1));  // first file wins
    }
    conf.path = path;
    break;
  }
  return conf;
}

struct Lookup {
  ConfFile conf = readConfFiles();
  // Returns true and the value when the variable is set.
  bool get(const char* env, std::string& out) const {
    std::string source;
    return get(env, out, source);
  }
  // Also says where the value came from: "environment" or "config file <path>".
  bool get(const char* env, std::string& out, std::string& source) const {
    if (const char* v = std::getenv(env)) {
      out = v;
      source = "environment";
      return true;
    }
    auto it = conf.values.find(env);
    if (it == conf.values.end()) return false;
    out = it->second;
    source = "config file " + conf.path;
    return true;
  }
};

void parse(const std::string& text, int64_t& out, int64_t def) {
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 0);
  out = (end && *end == '\0' && !text.empty()) ? v : def;
}
void parse(const std::string& text, std::string& out, const char*) { out = text; }
[[maybe_unused]] void parse(const std::string& text, bool& out, bool def) {
  if (text == "1" || text == "true" || text == "yes" || text == "on") out = true;
  else if (text == "0" || text == "false" || text == "no" || text == "off") out = false;
  else out = def;
}

std::unique_ptr<Params> load() {
  Lookup lookup;
  auto p = std::make_unique<Params>();
  std::string text;
#define SHOAL_PARAM(kind, field, env, def, help) \
  p->field = def;                                \
  if (lookup.get(env, text)) parse(text, p->field, def);
#include "core/params.def"
#undef SHOAL_PARAM
  return p;
}

std::mutex gMutex;  // loads
// What params() returns: read on every call of the user's, so without a
// lock. Never freed, nor the ones a reload replaces: a thread may still read
// them (one still running at exit, or one reading during
// ncclResetDebugInit); a reload is rare and small.
std::atomic<const Params*> gCurrent{nullptr};

}  // namespace

const Params& params() {
  if (const Params* p = gCurrent.load(std::memory_order_acquire)) [[likely]]
    return *p;
  std::lock_guard<std::mutex> lock(gMutex);
  if (const Params* p = gCurrent.load(std::memory_order_acquire)) return *p;
  const Params* loaded = load().release();
  gCurrent.store(loaded, std::memory_order_release);
  return *loaded;
}

int64_t handshakeTimeoutMs() {
  constexpr int64_t kDefaultMs = 5000;
  return params().handshakeTimeoutMs > 0 ? params().handshakeTimeoutMs : kDefaultMs;
}

void reloadParams() {
  std::lock_guard<std::mutex> lock(gMutex);
  static auto* replaced = new std::vector<const Params*>;  // kept, and reachable
  if (const Params* old = gCurrent.load(std::memory_order_relaxed)) replaced->push_back(old);
  gCurrent.store(load().release(), std::memory_order_release);
}

std::vector<ParamInfo> describeParams() {
  Lookup lookup;
  std::vector<ParamInfo> out;
#define SHOAL_PARAM(kind, field, env, def, help)           \
  {                                                        \
    ParamInfo info{env, #kind, #def, help, "", false};     \
    info.isSet = lookup.get(env, info.value, info.source); \
    if (!info.isSet) info.source = "default";              \
    out.push_back(std::move(info));                        \
  }
#include "core/params.def"
#undef SHOAL_PARAM
  return out;
}

std::vector<UnhonouredInfo> describeUnhonoured() {
  Lookup lookup;
  std::vector<UnhonouredInfo> out;
#define SHOAL_UNHONOURED(level, env, reason)                                          \
  {                                                                                  \
    UnhonouredInfo info{env, std::string_view(#level) == "Warn", reason, "", false, ""}; \
    info.isSet = lookup.get(env, info.value, info.source);                           \
    out.push_back(std::move(info));                                                  \
  }
#include "core/unhonoured.def"
#undef SHOAL_UNHONOURED
  return out;
}

void logUnhonouredOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const auto& u : describeUnhonoured()) {
      if (!u.isSet) continue;
      std::string from = u.source == "environment" ? "" : " (from " + u.source + ")";
      if (u.warn)
        SHOAL_WARN(u.env, "=", u.value, from, " is not honoured: ", u.reason);
      else
        SHOAL_INFO(subsys::kEnv, u.env, "=", u.value, from, " is ignored: ", u.reason);
    }
  });
}

std::string paramsMarkdown() {
  std::string md =
      "# Environment variables\n\n"
      "Generated from `src/core/params.def` by `shoal_env_doc`; do not edit by hand.\n"
      "Values come from the environment, else from `NCCL_CONF_FILE`, `~/.nccl.conf` or "
      "`/etc/nccl.conf` (`VAR=value` lines).\n\n"
      "| variable | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& p : describeParams()) {
    std::string def = p.defaultValue;
    if (def == "\"\"") def = "(unset)";
    md += std::string("| `") + p.env + "` | " + p.kind + " | `" + def + "` | " + p.help + " |\n";
  }
  md +=
      "\n## NCCL variables Shoal does not honour\n\n"
      "Generated from `src/core/unhonoured.def`. NVIDIA NCCL documents these; Shoal reads them only to "
      "say so: each one that is set (environment or config file) is logged once per process, at the "
      "first communicator init, with the reason: at WARN where a user may rely on its effect, at INFO "
      "(subsystem ENV) where it is harmless here. `shoal-info` lists the ones set.\n\n"
      "| variable | logged at | why |\n|---|---|---|\n";
  for (const auto& u : describeUnhonoured())
    md += std::string("| `") + u.env + "` | " + (u.warn ? "WARN" : "INFO") + " | " + u.reason + " |\n";
  return md;
}

}  // namespace shoal
