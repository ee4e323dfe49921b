// The messages of communicator set-up (src/comm/init_agreement.h): each
// round-trips, is refused when cut short, padded, of another kind or out of
// range, and agree() pools proposals the same way for every rank.
#include <catch2/catch.hpp>

#include <poll.h>
#include <unistd.h>

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "comm/init_agreement.h"
#include "comm/window.h"

using namespace shoal;

namespace {

PeerInfo samplePeer() {
  PeerInfo p;
  p.rank = 3;
  p.hostname = "node-b";
  p.hostId = "node-b:1234";
  p.processId = 0xfedcba9876543210ull;
  p.addresses = {{"tcp", "10.0.0.2:4000"}, {"shm", "shoal-77"}};
  p.kernelId = "boot-1";
  p.gpu = "GPU-0011";
  return p;
}

MachineTopology sampleMachine(int cores) {
  MachineTopology m;
  m.packages = 2;
  m.cores = cores;
  m.numaNodes = 2;
  m.l2Bytes = 2 << 20;
  m.l3Bytes = 32 << 20;
  m.l3Count = 2;
  m.gpus = 1;
  return m;
}

// Every strict prefix of a message is refused.
template <typename Decode>
void everyPrefixRefused(const std::string& bytes, Decode decode) {
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("prefix of " << n << " of " << bytes.size() << " bytes");
    CHECK_FALSE(decode(std::string_view(bytes).substr(0, n)).isOk());
  }
}

}  // namespace

TEST_CASE("PeerInfo keeps its byte form: length-prefixed decimal and text fields", "[init_agreement]") {
  PeerInfo p;
  p.rank = 1;
  p.hostname = "h";
  p.hostId = "i";
  p.processId = 42;
  p.kernelId = "k";
  p.gpu = "";
  const std::string expected = std::string("\x01\0\0\0" "1" "\x01\0\0\0" "h" "\x01\0\0\0" "i" "\x02\0\0\0" "42"
                                           "\x01\0\0\0" "0" "\x01\0\0\0" "k" "\0\0\0\0", 35);
  CHECK(p.serialize() == expected);
  auto back = PeerInfo::deserialize(expected);
  REQUIRE(back.isOk());
  CHECK(back->processId == 42);
  // A writer that knew neither the kernel id nor the GPU: both empty.
  auto older = PeerInfo::deserialize(expected.substr(0, 26));
  REQUIRE(older.isOk());
  CHECK(older->kernelId.empty());
  // Numbers must be numbers.
  std::string bad = expected;
  bad[4] = 'x';
  CHECK_FALSE(PeerInfo::deserialize(bad).isOk());
}

TEST_CASE("a peer record round-trips and refuses what no writer makes", "[init_agreement]") {
  const std::string bytes = encodePeerRecord(PeerRecord{8, samplePeer(), 0x0123456789abcdefull});
  auto back = decodePeerRecord(bytes);
  REQUIRE(back.isOk());
  CHECK(back->nranks == 8);
  CHECK(back->nonce == 0x0123456789abcdefull);
  CHECK(back->info.rank == 3);
  CHECK(back->info.hostname == "node-b");
  CHECK(back->info.processId == 0xfedcba9876543210ull);
  REQUIRE(back->info.addresses.size() == 2);
  CHECK(back->info.addresses[1].second == "shoal-77");
  CHECK(back->info.gpu == "GPU-0011");
  everyPrefixRefused(bytes, decodePeerRecord);
  CHECK_FALSE(decodePeerRecord(bytes + "x").isOk());                          // trailing bytes
  CHECK_FALSE(decodePeerRecord(encodePeerRecord(PeerRecord{0, samplePeer()})).isOk());  // no ranks
  auto wrongKind = decodePeerRecord(encodeSplitRecord(SplitRecord{1, 2}));
  REQUIRE_FALSE(wrongKind.isOk());
  CHECK(wrongKind.status().message().find("malformed peer record") != std::string::npos);
}

TEST_CASE("an init proposal round-trips with and without a network link", "[init_agreement]") {
  InitProposal withLink;
  withLink.readsEveryPeer = false;
  withLink.deviceDirect = true;
  withLink.streamPlans = true;
  withLink.fewHardwareQueues = true;
  withLink.synchronousStreams = true;
  withLink.netLink = NetLink{"tcp", true, true};
  withLink.machine = sampleMachine(96);
  const std::string bytes = encodeInitProposal(withLink);
  auto back = decodeInitProposal(bytes);
  REQUIRE(back.isOk());
  CHECK_FALSE(back->readsEveryPeer);
  CHECK(back->deviceDirect);
  CHECK(back->streamPlans);
  CHECK(back->fewHardwareQueues);
  CHECK(back->synchronousStreams);
  REQUIRE(back->netLink.has_value());
  CHECK(*back->netLink == NetLink{"tcp", true, true});
  CHECK(back->machine.cores == 96);
  CHECK(back->machine.l3Bytes == (32u << 20));
  everyPrefixRefused(bytes, decodeInitProposal);
  CHECK_FALSE(decodeInitProposal(bytes + std::string(1, '\0')).isOk());

  InitProposal plain;
  plain.machine = sampleMachine(4);
  auto plainBack = decodeInitProposal(encodeInitProposal(plain));
  REQUIRE(plainBack.isOk());
  CHECK(plainBack->readsEveryPeer);
  CHECK_FALSE(plainBack->deviceDirect);
  CHECK_FALSE(plainBack->streamPlans);
  CHECK_FALSE(plainBack->fewHardwareQueues);
  CHECK_FALSE(plainBack->synchronousStreams);
  CHECK_FALSE(plainBack->netLink.has_value());

  // A flag byte other than 0 or 1 (each of the six), and a link without a
  // transport name.
  for (size_t at = 1; at <= 6; ++at) {
    std::string badFlag = encodeInitProposal(plain);
    badFlag[at] = 2;
    CHECK_FALSE(decodeInitProposal(badFlag).isOk());
  }
  InitProposal unnamed = withLink;
  unnamed.netLink->transport.clear();
  CHECK_FALSE(decodeInitProposal(encodeInitProposal(unnamed)).isOk());
}

TEST_CASE("agree pools proposals: peer reads need everyone, the leader names the link, machines meet", "[init_agreement]") {
  std::vector<InitProposal> proposals(3);
  for (int r = 0; r < 3; ++r) proposals[r].machine = sampleMachine(8 + r);
  proposals[1].netLink = NetLink{"ofi", false, false};
  auto agreed = agree(proposals);
  REQUIRE(agreed.isOk());
  CHECK(agreed->everyoneReadsPeers);
  REQUIRE(agreed->netLink.has_value());
  CHECK(agreed->netLink->transport == "ofi");
  CHECK(agreed->machine.cores == 8);

  proposals[2].readsEveryPeer = false;
  REQUIRE(agree(proposals).isOk());
  CHECK_FALSE(agree(proposals)->everyoneReadsPeers);

  proposals[0].netLink = NetLink{"tcp", true, false};
  auto twoLinks = agree(proposals);
  REQUIRE_FALSE(twoLinks.isOk());
  CHECK(twoLinks.status().message().find("two ranks proposed the network link") != std::string::npos);
}

TEST_CASE("agree: device-direct needs every rank and stream links need every rank with stream plans", "[init_agreement]") {
  std::vector<InitProposal> proposals(3);
  for (InitProposal& p : proposals) {
    p.deviceDirect = true;
    p.streamPlans = true;
    p.readsEveryPeer = true;  // over shm, or threads of one process
  }
  auto agreed = agree(proposals);
  REQUIRE(agreed.isOk());
  CHECK(agreed->deviceDirect);
  CHECK(agreed->notDeviceDirect.empty());
  CHECK(agreed->streamLinks);
  CHECK(agreed->noStreamLinks.empty());
  // Device buffers outside windows are read by no host step and no device
  // plan: a plan reading the peers would stage every call.
  CHECK_FALSE(agreed->everyoneReadsPeers);

  // One rank without stream plans: device-direct still, no stream links.
  proposals[2].streamPlans = false;
  agreed = agree(proposals);
  REQUIRE(agreed.isOk());
  CHECK(agreed->deviceDirect);
  CHECK_FALSE(agreed->streamLinks);
  CHECK(agreed->noStreamLinks ==
        "rank 2 does not run stream plans (SHOAL_CUDA_WAIT, SHOAL_CUDA_STREAM_PLANS, or its peers: see its INFO log)");
  CHECK_FALSE(agreed->everyoneReadsPeers);

  proposals[2].streamPlans = true;
  proposals[1].deviceDirect = false;
  agreed = agree(proposals);
  REQUIRE(agreed.isOk());
  CHECK_FALSE(agreed->deviceDirect);
  CHECK(agreed->notDeviceDirect == "rank 1 cannot move device memory to every peer");
  CHECK(agreed->everyoneReadsPeers);  // back on the default transports
  CHECK(agreed->streamLinks);         // a forced cuda_ipc would carry them

  // Nobody could: nothing to explain.
  for (InitProposal& p : proposals) {
    p.deviceDirect = false;
    p.streamPlans = false;
  }
  agreed = agree(proposals);
  REQUIRE(agreed.isOk());
  CHECK_FALSE(agreed->deviceDirect);
  CHECK(agreed->notDeviceDirect.empty());
  CHECK_FALSE(agreed->streamLinks);
  CHECK(agreed->noStreamLinks.empty());
}

TEST_CASE("agree names the first rank with too few hardware queues and with synchronous streams", "[init_agreement]") {
  for (bool deviceDirect : {false, true}) {
    std::vector<InitProposal> proposals(4);
    for (InitProposal& p : proposals) {
      p.deviceDirect = deviceDirect;
      p.streamPlans = deviceDirect;
    }
    auto agreed = agree(proposals);
    REQUIRE(agreed.isOk());
    CHECK(agreed->deviceDirect == deviceDirect);
    CHECK(agreed->rankWithFewQueues == -1);
    CHECK(agreed->rankSynchronous == -1);
    proposals[3].fewHardwareQueues = true;
    proposals[2].fewHardwareQueues = true;
    proposals[1].synchronousStreams = true;
    agreed = agree(proposals);
    REQUIRE(agreed.isOk());
    CHECK(agreed->rankWithFewQueues == 2);
    CHECK(agreed->rankSynchronous == 1);
    CHECK(agreed->deviceDirect == deviceDirect);  // decided apart
  }
}

TEST_CASE("a split record round-trips, NCCL_SPLIT_NOCOLOR and negative keys included", "[init_agreement]") {
  for (SplitRecord r : {SplitRecord{0, 0}, SplitRecord{-1, 5}, SplitRecord{7, -3}, SplitRecord{2147483647, -2147483647}}) {
    auto back = decodeSplitRecord(encodeSplitRecord(r));
    REQUIRE(back.isOk());
    CHECK(back->color == r.color);
    CHECK(back->key == r.key);
  }
  everyPrefixRefused(encodeSplitRecord(SplitRecord{1, 2}), decodeSplitRecord);
  CHECK_FALSE(decodeSplitRecord(encodePeerRecord(PeerRecord{2, samplePeer()})).isOk());
}

TEST_CASE("a window record and window flags round-trip, and malformed ones are refused", "[init_agreement]") {
  WindowRecord host;
  host.address = 0x7f0000001000;
  host.bytes = 4096;
  host.pid = 4242;
  host.pidNamespace = 4026531836;
  host.sharedSequence = 3;
  host.sharedOffset = 128;
  WindowRecord device = host;
  device.sharedSequence = 0;
  device.sharedOffset = 0;
  device.deviceMemory = true;
  device.deviceSerial = 7;
  device.deviceBytes = 2u << 20;
  device.deviceOffset = (2u << 20) - 4096;
  device.mailbox = "shoal-window-4242-0123456789abcdef";
  device.netNamespace = 4026531840;
  device.uid = 1000;
  device.symmetric = true;
  device.boardAddress = 0x7f0000200000;
  for (const WindowRecord& r : {WindowRecord{}, host, device}) {
    auto back = decodeWindowRecord(encodeWindowRecord(r));
    REQUIRE(back.isOk());
    CHECK(back.value() == r);
  }
  everyPrefixRefused(encodeWindowRecord(device), decodeWindowRecord);
  // A buffer that does not lie inside the allocation a peer would map.
  WindowRecord outside = device;
  outside.deviceOffset = (2u << 20) - 2048;
  auto refused = decodeWindowRecord(encodeWindowRecord(outside));
  REQUIRE_FALSE(refused.isOk());
  CHECK(refused.status().message().find("in an allocation of") != std::string::npos);
  outside.deviceOffset = ~0ull;
  CHECK_FALSE(decodeWindowRecord(encodeWindowRecord(outside)).isOk());
  // A mailbox name longer than a Unix socket name can be.
  WindowRecord longName = device;
  longName.mailbox.assign(200, 'x');
  CHECK_FALSE(decodeWindowRecord(encodeWindowRecord(longName)).isOk());
  // A flag byte other than 0 or 1 (the symmetric flag sits before the board's 8 bytes).
  std::string badSymmetric = encodeWindowRecord(device);
  badSymmetric[badSymmetric.size() - 9] = 2;
  CHECK_FALSE(decodeWindowRecord(badSymmetric).isOk());

  for (const WindowFlags& f : {WindowFlags{}, WindowFlags{"", {true, false, true}},
                               WindowFlags{"cuMemExportToShareableHandle failed", {true}}}) {
    auto back = decodeWindowFlags(encodeWindowFlags(f));
    REQUIRE(back.isOk());
    CHECK(back.value() == f);
  }
  everyPrefixRefused(encodeWindowFlags(WindowFlags{"x", {true, false}}), decodeWindowFlags);
  std::string badFlag = encodeWindowFlags(WindowFlags{"", {true}});
  badFlag.back() = 2;
  CHECK_FALSE(decodeWindowFlags(badFlag).isOk());
  CHECK_FALSE(decodeWindowFlags(encodeWindowRecord(host)).isOk());
  CHECK_FALSE(decodeWindowRecord(encodeSplitRecord(SplitRecord{1, 2})).isOk());
}

TEST_CASE("a window mailbox takes descriptors only with a ticket of this registration and secret", "[init_agreement]") {
  Result<WindowMailbox> opened = WindowMailbox::open();
  REQUIRE(opened.isOk());
  WindowMailbox box = std::move(opened).value();
  CHECK(box.name().rfind("shoal-window-", 0) == 0);
  const std::string secret = "the communicator's secret";
  const WindowMailbox::Ticket to2{0xc0ffee, 3, 0, 2};  // its `from` is each sender's
  // One pipe per message: what arrives tells which message was taken.
  std::vector<std::array<int, 2>> pipes;
  auto sendAs = [&](int from, const std::function<void(WindowMailbox::Ticket&)>& spoil, const std::string& key) {
    std::array<int, 2> p{};
    REQUIRE(pipe(p.data()) == 0);
    pipes.push_back(p);
    WindowMailbox::Ticket t = to2;
    t.from = from;
    if (spoil) spoil(t);
    REQUIRE(WindowMailbox::send(box.name(), p[0], t, key, Deadline::afterMs(2000)).isOk());
    return pipes.size() - 1;
  };
  // Rank 1: a wrong secret, another registration, another communicator,
  // another receiver, then the right one, then a duplicate. Rank 3 was not
  // expected. Rank 0: right.
  sendAs(1, nullptr, "another secret");
  sendAs(1, [](WindowMailbox::Ticket& t) { t.registration = 4; }, secret);
  sendAs(1, [](WindowMailbox::Ticket& t) { t.commId = 0xbeef; }, secret);
  sendAs(1, [](WindowMailbox::Ticket& t) { t.to = 1; }, secret);
  const size_t good1 = sendAs(1, nullptr, secret);
  sendAs(1, nullptr, secret);
  sendAs(3, nullptr, secret);
  const size_t good0 = sendAs(0, nullptr, secret);
  Result<std::vector<net::Fd>> got = box.receive({true, true, false, false}, to2, secret, Deadline::afterMs(2000));
  REQUIRE(got.isOk());
  REQUIRE(got->size() == 4);
  CHECK_FALSE(got.value()[2].valid());
  CHECK_FALSE(got.value()[3].valid());
  // Each slot holds the right message's pipe: a byte written into that
  // pipe comes out of the descriptor received.
  for (auto [rank, message] : {std::pair<int, size_t>{0, good0}, std::pair<int, size_t>{1, good1}}) {
    REQUIRE(got.value()[static_cast<size_t>(rank)].valid());
    REQUIRE(write(pipes[message][1], "w", 1) == 1);
    char c = 0;
    pollfd pfd{got.value()[static_cast<size_t>(rank)].get(), POLLIN, 0};
    CHECK(poll(&pfd, 1, 1000) == 1);
    CHECK(read(got.value()[static_cast<size_t>(rank)].get(), &c, 1) == 1);
    CHECK(c == 'w');
  }
  // Only spoiled tickets from an expected sender: the deadline, named.
  sendAs(2, nullptr, "another secret");
  Result<std::vector<net::Fd>> late = box.receive({false, false, true, false}, to2, secret, Deadline::afterMs(200));
  REQUIRE_FALSE(late.isOk());
  CHECK(late.status().code() == Code::kTimeout);
  CHECK(late.status().message().find("did not arrive") != std::string::npos);
  for (auto& p : pipes) {
    close(p[0]);
    close(p[1]);
  }
}
