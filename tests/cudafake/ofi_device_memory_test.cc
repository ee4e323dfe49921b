// Device buffers over the ofi transport, on the driver stand-in
// (tests/cudafake): libfabric here (Debian's 1.17) is built without CUDA, so
// no provider grants FI_HMEM and device buffers are staged through host
// memory. Checked: the INFO line saying so and why, the transport's
// movesDeviceMemory() reading false, collectives on device buffers over
// ofi giving the right data, and a device buffer handed straight to an ofi
// connection refused with the reason instead of read by the CPU (the stand-in
// maps device memory PROT_NONE, so a read would crash). The decision itself,
// including its positive side, is a pure function tested in
// tests/transport/ofi_test.cc.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <nccl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "core/params.h"
#include "core/tag.h"
#include "cudafake/device_ranks.h"
#include "support/mp_harness.h"
#include "transports/ofi/ofi_transport.h"
#include "transports/registry.h"

namespace {

// The library loads the stand-in this binary links (before anything reads
// the parameters).
const bool kDriverNamed = setenv("SHOAL_CUDA_DRIVER", SHOAL_CUDAFAKE_LIB, 0) == 0;

constexpr const char* kStagedLine = "ofi: device buffers are staged through host memory: ";
// Why, here: libfabric offers no FI_HMEM (or, with a libfabric that has it,
// a registration of the stand-in's memory fails).
constexpr const char* kNotGranted = "provider tcp;ofi_rxm did not grant FI_HMEM (libfabric built without CUDA?)";
constexpr const char* kTrialFailed = "trial registration of 2 MiB of device memory failed: ";

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

float val(int rank, size_t i) { return static_cast<float>((rank + 1) * 1000 + i % 1000); }

// n floats on the device holding f(i); freed on scope exit.
struct DeviceFloats {
  CUdeviceptr ptr = 0;
  size_t n = 0;
  bool ok = false;
  DeviceFloats(size_t count, const std::function<float(size_t)>& f) : n(count) {
    if (cuMemAlloc(&ptr, n * sizeof(float)) != CUDA_SUCCESS) return;
    std::vector<float> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = f(i);
    ok = cuMemcpyHtoD(ptr, host.data(), n * sizeof(float)) == CUDA_SUCCESS;
  }
  ~DeviceFloats() { cuMemFree(ptr); }
  DeviceFloats(const DeviceFloats&) = delete;
  float* at() const { return reinterpret_cast<float*>(ptr); }
  std::vector<float> read() const {
    std::vector<float> host(n);
    if (cuMemcpyDtoH(host.data(), ptr, n * sizeof(float)) != CUDA_SUCCESS) host.clear();
    return host;
  }
};

void useDevice0() {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
}

}  // namespace

TEST_CASE("over ofi device buffers are staged - logged with the reason - the capability reads false - data correct",
          "[cudafake][mp][ofi]") {
  char logPath[] = "/tmp/shoal-cudafake-ofi-log-XXXXXX";
  int fd = mkstemp(logPath);
  REQUIRE(fd >= 0);
  close(fd);
  shoal::testing::MpConfig cfg;
  cfg.nranks = 2;
  // Every buffer registered, as providers with FI_MR_LOCAL (EFA, verbs) need.
  cfg.env = {{"SHOAL_TRANSPORT", "ofi"},     {"FI_PROVIDER", "tcp;ofi_rxm"},
             {"FI_TCP_IFACE", "lo"},         {"NCCL_SOCKET_IFNAME", "lo"},
             {"NCCL_DEBUG", "INFO"},         {"NCCL_DEBUG_SUBSYS", "INIT,NET"},
             {"NCCL_DEBUG_FILE", std::string(logPath) + ".%p"},
             {"SHOAL_OFI_ALWAYS_REGISTER", "1"}};
  // As an application does: the device's context current before init.
  auto result = shoal::testing::forkedDeviceRanks(cfg, [&](shoal::testing::MpChild& child, ncclComm_t comm,
                                                           CUstream s) -> int {
    shoal::Transport* ofi = shoal::findTransport("ofi");
    if (ofi == nullptr) return 15;
    child.log(std::string("movesDeviceMemory ") + (ofi->movesDeviceMemory() ? "true" : "false"));
    const int me = child.rank(), n = child.nranks();
    const shoal::ofi::RegistrationStats before = shoal::ofi::registrationStats();
    int bad = 0;
    // Small and above the striping threshold (256 KiB), in place and not.
    for (size_t count : {size_t{1000}, size_t{300000}}) {
      DeviceFloats send(count, [&](size_t i) { return val(me, i); });
      DeviceFloats recv(count, [](size_t) { return -1.0f; });
      if (!send.ok || !recv.ok) return 16;
      if (ncclAllReduce(send.at(), recv.at(), count, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 17;
      if (ncclAllReduce(send.at(), send.at(), count, ncclFloat, ncclMax, comm, s) != ncclSuccess) return 18;
      if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 19;
      std::vector<float> sum = recv.read(), most = send.read();
      if (sum.size() != count || most.size() != count) return 20;
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += val(r, i);
        bad += sum[i] != want;
        bad += most[i] != val(n - 1, i);
      }
      DeviceFloats gathered(count * n, [](size_t) { return -1.0f; });
      if (ncclAllGather(recv.at(), gathered.at(), count, ncclFloat, comm, s) != ncclSuccess) return 21;
      if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 22;
      std::vector<float> all = gathered.read();
      if (all.size() != count * n) return 23;
      for (size_t i = 0; i < all.size(); ++i) bad += all[i] != sum[i % count];
    }
    if (bad) child.log("wrong elements: " + std::to_string(bad));
    cuStreamSynchronize(s);
    const shoal::ofi::RegistrationStats used = shoal::ofi::registrationStats();
    ncclCommDestroy(comm);
    cuStreamDestroy(s);
    // The staging grew (a larger slot replaced a smaller one) and went with
    // the communicator: no registration of it may outlive it (the memory
    // behind a kept one could come back at its address); while it lived its
    // registrations, and the scratch's, were reused.
    const shoal::ofi::RegistrationStats after = shoal::ofi::registrationStats();
    child.log("registrations " + std::to_string(used.registrations - before.registrations) + ", reused " +
              std::to_string(used.hits - before.hits) + ", per operation " + std::to_string(used.perOperation - before.perOperation) + ", open after destroy " + std::to_string(after.live) +
              " (before " + std::to_string(before.live) + ")");
    if (used.hits == before.hits) return 24;
    // ofi sees only Shoal's staging and scratch here, all kept registered.
    if (used.perOperation != before.perOperation) return 26;
    if (after.live > before.live) return 25;
    return bad == 0 ? 0 : 1;
  });
  INFO(result.report());
  CHECK(result.allPassed());
  for (const auto& rank : result.ranks) {
    CHECK(rank.log.find("movesDeviceMemory false") != std::string::npos);
    std::string path = std::string(logPath) + "." + std::to_string(rank.pid);
    std::string log = readFile(path);
    ::unlink(path.c_str());
    INFO("rank " << rank.rank << " log:\n" << log);
    size_t at = log.find(kStagedLine);
    REQUIRE(at != std::string::npos);
    std::string why = log.substr(at + std::strlen(kStagedLine), log.find('\n', at) - at - std::strlen(kStagedLine));
    CHECK((why == kNotGranted || why.rfind(kTrialFailed, 0) == 0));
    CHECK(log.find(kStagedLine, at + 1) == std::string::npos);  // once per process (one rail)
    CHECK(log.find("device buffers are registered with FI_HMEM") == std::string::npos);
  }
  ::unlink(logPath);
}

namespace {

// One side of ofi connection `commId` between two transports of this process.
shoal::Result<std::unique_ptr<shoal::Connection>> connectSide(shoal::Transport& transport,
                                                              std::shared_ptr<shoal::Store> store, uint64_t commId,
                                                              int rank) {
  shoal::PeerInfo self;
  self.rank = rank;
  self.hostname = rank == 0 ? "host-a" : "host-b";
  self.hostId = "one-host";
  self.kernelId = "one-kernel";
  SHOAL_ASSIGN_OR_RETURN(std::string address, transport.localAddress());
  self.addresses.emplace_back("ofi", address);
  shoal::Bootstrap bootstrap(store, "comm" + std::to_string(commId), rank, 2);
  shoal::Deadline deadline = shoal::Deadline::afterMs(20000);
  SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> all, bootstrap.allGather(self.serialize(), deadline));
  SHOAL_ASSIGN_OR_RETURN(shoal::PeerInfo peer, shoal::PeerInfo::deserialize(all[static_cast<size_t>(1 - rank)]));
  shoal::ConnectOptions options;
  options.self = &self;
  options.peer = &peer;
  options.secret = "device buffer test";
  options.deadline = deadline;
  return transport.connect(shoal::ConnectionKey{commId, rank, 1 - rank, 0}, options);
}

}  // namespace

TEST_CASE("a device buffer handed straight to an ofi connection that stages is refused with the reason, never read",
          "[cudafake][ofi]") {
  setenv("FI_TCP_IFACE", "lo", 0);
  useDevice0();
  auto t0 = shoal::makeOfiTransport(shoal::OfiOptions{"tcp;ofi_rxm"});
  auto t1 = shoal::makeOfiTransport(shoal::OfiOptions{"tcp;ofi_rxm"});
  REQUIRE(t0->localAddress().isOk());
  CHECK_FALSE(t0->movesDeviceMemory());
  uint64_t commId = 1;
  // Below the inject size (a send the provider would copy inline), above it,
  // and above the clear-to-send threshold (128 KiB over rxm); a connection
  // fails for good at its first error, so one pair each.
  for (size_t bytes : {size_t{64}, size_t{16} << 10, size_t{1} << 20}) {
    auto store = shoal::makeMemoryStore();
    ++commId;
    auto side1 = std::async(std::launch::async, [&] { return connectSide(*t1, store, commId, 1); });
    auto c0 = connectSide(*t0, store, commId, 0);
    auto c1 = side1.get();
    INFO(c0.status().toString() << " / " << c1.status().toString());
    REQUIRE(c0.isOk());
    REQUIRE(c1.isOk());
    CUdeviceptr device = 0;
    REQUIRE(cuMemAlloc(&device, bytes) == CUDA_SUCCESS);
    uint64_t tag = shoal::encodeTag(shoal::CollKind::kSend, shoal::DataType::kUint8, bytes, 0, -1, 1);
    std::vector<uint8_t> landing(bytes);
    REQUIRE(c1.value()->postRecv(landing.data(), bytes, tag, 2).isOk());
    shoal::Status sent = c0.value()->postSend(reinterpret_cast<void*>(device), bytes, tag, 1);
    // A send may be issued only at a later poll (striped, or waiting for
    // its clear-to-send): pump both ends until it fails or completes.
    std::vector<shoal::Completion> done;
    shoal::Deadline deadline = shoal::Deadline::afterMs(20000);
    while (sent.isOk() && done.empty() && !deadline.expired()) {
      bool progressed = false;
      sent = c0.value()->poll(done, progressed);
      if (shoal::Status other = c1.value()->poll(done, progressed); sent.isOk() && !other.isOk()) sent = other;
    }
    INFO(bytes << " bytes: " << sent.toString() << ", " << done.size() << " completions");
    REQUIRE_FALSE(sent.isOk());
    CHECK(sent.message().find("does not register device memory (") != std::string::npos);
    CHECK(sent.message().find("device buffers must be staged through host memory") != std::string::npos);
    cuMemFree(device);
  }
}
