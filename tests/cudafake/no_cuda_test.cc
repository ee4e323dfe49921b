// A process that does not use CUDA never loads or initializes it, even with
// SHOAL_CUDA_DRIVER naming a driver (here the stand-in, which this binary
// does not link): the library runs on host memory and says so at INFO.
#include <catch2/catch.hpp>

#include <nccl.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {
// Set before anything reads the parameters: the stand-in (which this binary
// does not link) as the driver, and an INFO log to a file.
const bool kEnvSet = setenv("SHOAL_CUDA_DRIVER", SHOAL_CUDAFAKE_LIB, 0) == 0 &&
                     setenv("NCCL_DEBUG", "INFO", 0) == 0 &&
                     setenv("NCCL_DEBUG_SUBSYS", "INIT", 0) == 0 &&
                     setenv("NCCL_DEBUG_FILE", SHOAL_NO_CUDA_LOG, 0) == 0;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TEST_CASE("a process that does not use CUDA runs on host memory and never loads the driver", "[cudafake]") {
  const char* driver = getenv("SHOAL_CUDA_DRIVER");
  REQUIRE(kEnvSet);
  REQUIRE(driver != nullptr);
  const char* logPath = getenv("NCCL_DEBUG_FILE");
  REQUIRE(logPath != nullptr);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  std::vector<float> send(100, 2.0f), recv(100, 0.0f);
  REQUIRE(ncclAllReduce(send.data(), recv.data(), 100, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(recv[99] == 2.0f);
  void* mem = nullptr;
  REQUIRE(ncclMemAlloc(&mem, 4096) == ncclSuccess);  // host memory: writable here
  static_cast<char*>(mem)[4095] = 1;
  REQUIRE(ncclMemFree(mem) == ncclSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  std::string maps = readFile("/proc/self/maps");
  CHECK(maps.find("libshoal_cudafake") == std::string::npos);
  CHECK(maps.find("libcuda") == std::string::npos);
  std::string log = readFile(logPath);
  INFO(log);
  CHECK(log.find("host memory (this process does not use CUDA)") != std::string::npos);
}
