#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

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
