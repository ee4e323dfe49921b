// fuzz_conf_file: the NCCL_CONF_FILE reader (src/core/params.cc), which takes
// VAR=value lines from the file NCCL_CONF_FILE names (else ~/.nccl.conf or
// /etc/nccl.conf) for every parameter the environment leaves unset, and
// parses each value as its parameter's type.
//
// The reader (readConfFiles) and the value parsers are private to
// params.cc; the public entry that runs them is reloadParams(). The harness
// writes the input to a private temporary file, points NCCL_CONF_FILE at it
// and reloads; every parameter variable is removed from the harness's
// environment first, so that the file decides every value.
//
// Properties: describeParams() reports as set exactly the parameters whose
// name appears as "NAME=" at the start of a line that does not start with
// '#'; a parameter's value is the text after the first '=' of its first such
// line (the file's first occurrence wins).
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "core/params.h"
#include "fuzz_common.h"

namespace {

std::string gPath;

void removeFile() {
  if (!gPath.empty()) ::unlink(gPath.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (const shoal::ParamInfo& p : shoal::describeParams()) ::unsetenv(p.env);
  const char* dir = std::getenv("TMPDIR");
  std::string pattern = std::string(dir && *dir ? dir : "/tmp") + "/shoal-fuzz-conf-XXXXXX";
  int fd = ::mkstemp(pattern.data());
  if (fd < 0) {
    std::perror("mkstemp");
    std::abort();
  }
  ::close(fd);
  gPath = pattern;
  std::atexit(removeFile);
  ::setenv("NCCL_CONF_FILE", gPath.c_str(), 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = ::open(gPath.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  FUZZ_CHECK(fd >= 0, "cannot open %s", gPath.c_str());
  size_t done = 0;
  while (done < size) {
    ssize_t w = ::write(fd, data + done, size - done);
    FUZZ_CHECK(w > 0, "write to %s failed", gPath.c_str());
    done += static_cast<size_t>(w);
  }
  ::close(fd);

  shoal::reloadParams();
  (void)shoal::params();

  // What the file says, by the rule the header states (std::getline lines).
  std::map<std::string, std::string> expected;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.empty() || line[0] == '#') continue;
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    expected.emplace(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
  }
  for (const shoal::ParamInfo& p : shoal::describeParams()) {
    auto it = expected.find(p.env);
    FUZZ_CHECK(p.isSet == (it != expected.end()), "%s set=%d, the file %s it", p.env, int(p.isSet),
               it != expected.end() ? "sets" : "does not set");
    if (p.isSet) FUZZ_CHECK(p.value == it->second, "%s='%s', the file says '%s'", p.env, p.value.c_str(),
                            it->second.c_str());
  }
  return 0;
}
