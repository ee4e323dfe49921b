#include "core/params.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>

namespace shoal {
namespace {

// NCCL_CONF_FILE, then ~/.nccl.conf, then /etc/nccl.conf: VAR=value lines that
// apply where the environment does not set VAR (NCCL's behaviour).
std::map<std::string, std::string> readConfFiles() {
  std::map<std::string, std::string> values;
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
    break;
  }
  return values;
}

struct Lookup {
  std::map<std::string, std::string> conf = readConfFiles();
  // Returns true and the value when the variable is set.
  bool get(const char* env, std::string& out) const {
    if (const char* v = std::getenv(env)) {
      out = v;
      return true;
    }
    auto it = conf.find(env);
    if (it == conf.end()) return false;
    out = it->second;
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

std::mutex gMutex;
std::unique_ptr<Params> gParams;

}  // namespace

const Params& params() {
  std::lock_guard<std::mutex> lock(gMutex);
  if (!gParams) gParams = load();
  return *gParams;
}

void reloadParams() {
  std::lock_guard<std::mutex> lock(gMutex);
  gParams = load();
}

std::vector<ParamInfo> describeParams() {
  Lookup lookup;
  std::vector<ParamInfo> out;
#define SHOAL_PARAM(kind, field, env, def, help)           \
  {                                                        \
    ParamInfo info{env, #kind, #def, help, "", false};     \
    info.isSet = lookup.get(env, info.value);              \
    out.push_back(std::move(info));                        \
  }
#include "core/params.def"
#undef SHOAL_PARAM
  return out;
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
  return md;
}

}  // namespace shoal
