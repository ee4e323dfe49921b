// ncclConfig_t parsing: NCCL's size clamp, magic check and reset-by-version.
#include <catch2/catch.hpp>

#include <cstring>

#include "api/config.h"

using namespace shoal;

TEST_CASE("NULL config gives defaults", "[unit]") {
  auto c = api::resolveConfig(nullptr);
  REQUIRE(c.isOk());
  REQUIRE(c->blocking == 1);
  REQUIRE(c->minCTAs == 1);
  REQUIRE(c->maxCTAs == 64);
  REQUIRE(c->graphUsageMode == 2);
}

TEST_CASE("a config not made with the initializer is rejected", "[unit]") {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.magic = 0x1234;
  auto r = api::resolveConfig(&c);
  REQUIRE(r.status().code() == Code::kInvalidArgument);
  REQUIRE(r.status().message().find("NCCL_CONFIG_INITIALIZER") != std::string::npos);
}

TEST_CASE("fields newer than the caller's header version are reset", "[unit]") {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.version = NCCL_VERSION(2, 30, 4);
  c.blocking = 0;
  c.graphStreamOrdering = 0;  // padding for a 2.30.4 caller: must be ignored
  auto r = api::resolveConfig(&c);
  REQUIRE(r.isOk());
  REQUIRE(r->blocking == 0);
  REQUIRE(r->graphStreamOrdering == 1);
  c.version = NCCL_VERSION(2, 16, 0);
  c.minCTAs = 5;  // unknown to a 2.16 caller
  r = api::resolveConfig(&c);
  REQUIRE(r.isOk());
  REQUIRE(r->minCTAs == 1);
}

TEST_CASE("a larger (newer) struct is truncated to ours", "[unit]") {
  struct Bigger {
    ncclConfig_t base;
    int futureField;
  } big;
  big.base = NCCL_CONFIG_INITIALIZER;
  big.base.size = sizeof(Bigger);
  big.base.version = NCCL_VERSION(2, 35, 0);
  big.base.blocking = 0;
  big.futureField = 77;
  auto r = api::resolveConfig(&big.base);
  REQUIRE(r.isOk());
  REQUIRE(r->blocking == 0);
}

TEST_CASE("out-of-range values are invalid arguments", "[unit]") {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 2;
  REQUIRE(api::resolveConfig(&c).status().code() == Code::kInvalidArgument);
  c = NCCL_CONFIG_INITIALIZER;
  c.minCTAs = 8;
  c.maxCTAs = 4;
  REQUIRE(api::resolveConfig(&c).status().code() == Code::kInvalidArgument);
}
