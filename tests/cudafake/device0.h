// Device 0 of the driver stand-in made current on the calling test thread,
// as an application does (cuInit, its primary context), and its
// "GPU-<uuid>" as Shoal's driver sees it: what a PeerInfo names. Catch2
// assertions: the test's own thread only. The binary names the stand-in in
// SHOAL_CUDA_DRIVER before anything reads the parameters.
#pragma once

#include <catch2/catch.hpp>

#include <cuda.h>

#include <string>

#include "cuda/driver.h"

namespace shoal::testing {

inline std::string makeDevice0Current() {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  cuda::Driver* driver = cuda::Driver::inUse();
  REQUIRE(driver != nullptr);
  auto device = driver->currentDevice();
  REQUIRE(device.isOk());
  REQUIRE(device.value().has_value());
  return device.value()->uuidText();
}

}  // namespace shoal::testing
