#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <sstream>

#include "core/log.h"
#include "core/params.h"

using namespace shoal;

TEST_CASE("parameters come from the environment with defaults", "[unit]") {
  unsetenv("SHOAL_PROGRESS_TIMEOUT_MS");
  reloadParams();
  REQUIRE(params().progressTimeoutMs == 300000);
  setenv("SHOAL_PROGRESS_TIMEOUT_MS", "1234", 1);
  reloadParams();
  REQUIRE(params().progressTimeoutMs == 1234);
  setenv("SHOAL_PROGRESS_TIMEOUT_MS", "garbage", 1);
  reloadParams();
  REQUIRE(params().progressTimeoutMs == 300000);  // a bad number keeps the default
  unsetenv("SHOAL_PROGRESS_TIMEOUT_MS");
  reloadParams();
}

// Every handshake reads the timeout through handshakeTimeoutMs(): 0 must not
// mean "wait for an unauthenticated peer without end" in some of them.
TEST_CASE("SHOAL_HANDSHAKE_TIMEOUT_MS of 0 or less is the default for every handshake", "[unit]") {
  setenv("SHOAL_HANDSHAKE_TIMEOUT_MS", "1234", 1);
  reloadParams();
  CHECK(handshakeTimeoutMs() == 1234);
  for (const char* none : {"0", "-5"}) {
    setenv("SHOAL_HANDSHAKE_TIMEOUT_MS", none, 1);
    reloadParams();
    CHECK(handshakeTimeoutMs() == 5000);
  }
  unsetenv("SHOAL_HANDSHAKE_TIMEOUT_MS");
  reloadParams();
  CHECK(handshakeTimeoutMs() == 5000);
}

TEST_CASE("NCCL_DEBUG and NCCL_DEBUG_SUBSYS decide which lines pass", "[unit]") {
  auto load = [](const char* level, const char* subsys) {
    if (level) setenv("NCCL_DEBUG", level, 1);
    else unsetenv("NCCL_DEBUG");
    if (subsys) setenv("NCCL_DEBUG_SUBSYS", subsys, 1);
    else unsetenv("NCCL_DEBUG_SUBSYS");
    reloadParams();
    resetLogConfig();
  };
  load(nullptr, nullptr);  // NCCL's default: nothing, not even warnings
  CHECK_FALSE(logEnabled(LogLevel::kWarn, subsys::kAll));
  CHECK_FALSE(logEnabled(LogLevel::kTrace, subsys::kColl));
  load("WARN", nullptr);
  CHECK(logEnabled(LogLevel::kWarn, subsys::kAll));
  CHECK(logEnabled(LogLevel::kVersion, subsys::kAll));
  CHECK_FALSE(logEnabled(LogLevel::kInfo, subsys::kInit));
  load("INFO", "NET,TUNING");
  CHECK(logEnabled(LogLevel::kInfo, subsys::kNet));
  CHECK(logEnabled(LogLevel::kInfo, subsys::kTuning));
  CHECK_FALSE(logEnabled(LogLevel::kInfo, subsys::kColl));
  CHECK_FALSE(logEnabled(LogLevel::kTrace, subsys::kNet));  // above the level, whatever the subsystem
  load("TRACE", "^NET");
  CHECK(logEnabled(LogLevel::kTrace, subsys::kColl));
  CHECK_FALSE(logEnabled(LogLevel::kTrace, subsys::kNet));
  load("info", nullptr);  // case-insensitive, NCCL's default subsystems
  CHECK(logEnabled(LogLevel::kInfo, subsys::kInit));
  CHECK_FALSE(logEnabled(LogLevel::kTrace, subsys::kInit));
  load(nullptr, nullptr);
}

TEST_CASE("NCCL_CONF_FILE supplies values the environment does not set", "[unit]") {
  const char* path = "/tmp/shoal_params_test.conf";
  {
    std::ofstream out(path);
    out << "# comment\nNCCL_SOCKET_NTHREADS=3\nNCCL_ALGO=Ring\n";
  }
  setenv("NCCL_CONF_FILE", path, 1);
  setenv("NCCL_ALGO", "Tree", 1);
  reloadParams();
  REQUIRE(params().socketNthreads == 3);
  REQUIRE(params().algo == "Tree");  // the environment wins
  unsetenv("NCCL_CONF_FILE");
  unsetenv("NCCL_ALGO");
  reloadParams();
  std::remove(path);
}

TEST_CASE("docs/env.md is generated from the registry and current", "[unit]") {
  std::ifstream in(SHOAL_SOURCE_DIR "/docs/env.md");
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  INFO("regenerate with: build/src/api/shoal_env_doc > docs/env.md");
  REQUIRE(text.str() == paramsMarkdown());
}

TEST_CASE("every NCCL variable Shoal does not honour is declared once, and never also honoured", "[unit]") {
  std::set<std::string> honoured, unhonoured;
  for (const auto& p : describeParams()) honoured.insert(p.env);
  for (const auto& u : describeUnhonoured()) {
    INFO(u.env);
    REQUIRE(std::string(u.env).rfind("NCCL_", 0) == 0);
    REQUIRE(unhonoured.insert(u.env).second);  // declared once
    REQUIRE(honoured.count(u.env) == 0);       // not both read and ignored
    REQUIRE(std::string(u.reason).size() > 10);
  }
  for (const char* name : {"NCCL_PROTO", "NCCL_NTHREADS", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN",
                           "NCCL_P2P_LEVEL", "NCCL_TOPO_DUMP_FILE", "NCCL_CROSS_NIC", "NCCL_IB_HCA",
                           // NCCL 2.30's overrides of ncclConfig_t fields (its envConfigOverride)
                           "NCCL_CGA_CLUSTER_SIZE", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS", "NCCL_COMM_SPLIT_SHARE_RESOURCES",
                           "NCCL_COMM_SHRINK_SHARE_RESOURCES", "NCCL_COLLNET_ENABLE", "NCCL_CTA_POLICY",
                           "NCCL_NVLS_NCHANNELS", "NCCL_NCHANNELS_PER_NET_PEER", "NCCL_NVLINK_UTIL_CENTRIC_SCHED_ENABLE",
                           "NCCL_GRAPH_MIXING_SUPPORT", "NCCL_NUM_RMA_CTX", "NCCL_MAX_P2P_PEERS",
                           "NCCL_GRAPH_STREAM_ORDERING"})
    CHECK(unhonoured.count(name) == 1);
}

TEST_CASE("parameters and unhonoured variables say where their value came from", "[unit]") {
  setenv("SHOAL_SEGMENT_BYTES", "65536", 1);
  setenv("NCCL_PROTO", "Simple", 1);
  unsetenv("NCCL_NTHREADS");
  std::string source;
  for (const auto& p : describeParams())
    if (std::string(p.env) == "SHOAL_SEGMENT_BYTES") source = p.source + "=" + p.value;
    else if (std::string(p.env) == "SHOAL_IDLE_CHECK_MS" && !std::getenv("SHOAL_IDLE_CHECK_MS")) CHECK(p.source == "default");
  CHECK(source == "environment=65536");
  int seen = 0;
  for (const auto& u : describeUnhonoured()) {
    if (std::string(u.env) == "NCCL_PROTO") {
      CHECK(u.isSet);
      CHECK(u.warn);
      CHECK(u.value == "Simple");
      CHECK(u.source == "environment");
      ++seen;
    }
    if (std::string(u.env) == "NCCL_NTHREADS") {
      CHECK_FALSE(u.isSet);
      CHECK_FALSE(u.warn);
      ++seen;
    }
  }
  CHECK(seen == 2);
  unsetenv("SHOAL_SEGMENT_BYTES");
  unsetenv("NCCL_PROTO");
}
