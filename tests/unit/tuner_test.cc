// Tuner and topology: properties of the tuner's decisions that follow from the
// cost model's inputs (latency-bound sizes take the fewest latency terms,
// bandwidth-bound sizes the fewest bytes on the slowest link, decisions
// monotone in size), a recorded decision table for fixed topologies and link
// costs (a change detector, independent of this machine's calibration), the
// cost model's properties, SHOAL_TUNER_FILE and NCCL_ALGO/SHOAL_ALGO errors,
// node subgroups from fake PeerInfo lists, and a machine discovery smoke test.
//
// The recorded table (kGolden) is the tuner's own output: it proves nothing
// about whether a decision is right, only that none changed unnoticed.
// Regenerate it after a deliberate model change with
//   ./tests/tuner_tests '[.print]'
// and review the differences (against the property tests) before pasting them in.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "core/params.h"
#include "topology/machine.h"
#include "topology/topology.h"
#include "transports/registry.h"
#include "tuner/cost_model.h"
#include "tuner/tuner.h"

using namespace shoal;

namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;

// Fixed link costs: the golden table must not follow the calibration.
LinkTable testLinks() {
  LinkTable t;
  t[static_cast<size_t>(LinkClass::kLoopback)] = {1.0, 1.0 / 10000.0, 1.0 / 10000.0};  // 10 GB/s
  t[static_cast<size_t>(LinkClass::kShm)] = {3.0, 1.0 / 6000.0, 1.0 / 10000.0};        // 6 GB/s
  t[static_cast<size_t>(LinkClass::kNet)] = {25.0, 1.0 / 1250.0, 1.0 / 10000.0};       // 10 Gb/s
  return t;
}

MachineTopology smallMachine(int cores) {
  MachineTopology m;
  m.cores = cores;
  m.l2Bytes = 1 * MiB;
  m.l3Bytes = 32 * MiB;
  m.l3Count = 1;
  m.nics = {"eth0", "lo"};
  m.source = "test";
  return m;
}

MachineTopology bigMachine() {
  MachineTopology m;
  m.packages = 2;
  m.cores = 96;
  m.numaNodes = 2;
  m.l2Bytes = 2 * MiB;
  m.l3Bytes = 105 * MiB;
  m.l3Count = 2;
  m.gpus = 8;
  m.source = "test";
  return m;
}

struct NamedTopology {
  const char* name;
  TopologySummary summary;
};

TopologySummary summary(int nnodes, int perNode, LinkClass intra, LinkClass inter,
                        MachineTopology machine, bool singleProcess = false) {
  TopologySummary s;
  s.nranks = nnodes * perNode;
  s.nnodes = nnodes;
  s.singleProcess = singleProcess;
  s.maxRanksPerNode = perNode;
  s.minRanksPerNode = perNode;
  s.intraNode = intra;
  s.interNode = inter;
  s.machine = std::move(machine);
  return s;
}

// The summary a communicator agrees on when node 0's leader reaches node 1's
// through `netTransport`: ofi over a socket provider is the one transport
// whose messages pass an emulated layer (Transport::emulatesMessagesOverSockets).
TopologySummary over(TopologySummary s, std::string netTransport, bool cpuCopies) {
  s.netEmulatedOverSockets = cpuCopies && netTransport == "ofi";
  s.netTransport = std::move(netTransport);
  s.netCpuCopies = cpuCopies;
  return s;
}

// Across nodes: 2x2 over Shoal's tcp transport, 64x16 over a NIC (ofi/EFA).
const std::vector<NamedTopology>& topologies() {
  static const std::vector<NamedTopology> all = {
      {"1x2 shm", summary(1, 2, LinkClass::kShm, LinkClass::kNet, smallMachine(2))},
      {"1x4 shm", summary(1, 4, LinkClass::kShm, LinkClass::kNet, smallMachine(4))},
      {"2x2 net+shm", over(summary(2, 2, LinkClass::kShm, LinkClass::kNet, smallMachine(8)), "tcp", true)},
      {"1x8 loopback",
       summary(1, 8, LinkClass::kLoopback, LinkClass::kLoopback, smallMachine(8), true)},
      {"64x16 net+shm", over(summary(64, 16, LinkClass::kShm, LinkClass::kNet, bigMachine()), "ofi", false)},
  };
  return all;
}

TunerOptions testOptions() {
  TunerOptions o;
  o.links = testLinks();
  return o;
}

std::unique_ptr<Tuner> makeTuner(const TopologySummary& s, TunerOptions o = testOptions()) {
  auto tuner = Tuner::create(s, std::move(o));
  REQUIRE(tuner.isOk());
  return std::move(tuner).value();
}

CollShape shapeOf(CollKind kind, uint64_t bytes) {
  CollShape s;
  s.kind = kind;
  s.dtype = DataType::kUint8;
  s.count = bytes;
  if (kind == CollKind::kBroadcast || kind == CollKind::kReduce || kind == CollKind::kGather ||
      kind == CollKind::kScatter)
    s.root = 0;
  if (kind == CollKind::kSend) s.peer = 1;
  return s;
}

RankView viewOf(int nranks) {
  RankView v;
  v.nranks = nranks;
  for (int r = 0; r < nranks; ++r) v.ring.push_back(r);
  return v;
}

// As the communicator builds it: nodes of consecutive ranks; peers' memory is
// readable inside one host.
RankView viewOf(const TopologySummary& s) {
  RankView v = viewOf(s.nranks);
  for (int r = 0; r < s.nranks; ++r) v.nodeOf.push_back(r / s.maxRanksPerNode);
  v.peerReads = s.nnodes == 1;
  return v;
}

const std::vector<CollKind> kKinds = {CollKind::kAllReduce, CollKind::kAllGather,
                                      CollKind::kReduceScatter, CollKind::kBroadcast,
                                      CollKind::kReduce, CollKind::kAllToAll};
const std::vector<uint64_t> kSizes = {8, 1 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB};

struct GoldenRow {
  const char* topology;
  CollKind kind;
  uint64_t bytes;  // count of uint8 in NCCL's convention for the collective
  const char* algorithm;
  int channels;
  uint64_t segmentBytes;
};

std::string kindIdentifier(CollKind k) {
  switch (k) {
    case CollKind::kAllReduce: return "kAllReduce";
    case CollKind::kAllGather: return "kAllGather";
    case CollKind::kReduceScatter: return "kReduceScatter";
    case CollKind::kBroadcast: return "kBroadcast";
    case CollKind::kReduce: return "kReduce";
    case CollKind::kAllToAll: return "kAllToAll";
    default: return "?";
  }
}

std::string bytesIdentifier(uint64_t b) {
  if (b >= MiB && b % MiB == 0) return std::to_string(b / MiB) + " * MiB";
  if (b >= KiB && b % KiB == 0) return std::to_string(b / KiB) + " * KiB";
  return std::to_string(b);
}

// The tuner's decisions as recorded by '[.print]': a change detector (its
// test below), not a statement of what is right.
// clang-format off
const std::vector<GoldenRow> kGolden = {
    {"1x2 shm", CollKind::kAllReduce, 8, "recursive_doubling", 1, 4 * MiB},  // 3.0 us
    {"1x2 shm", CollKind::kAllReduce, 1 * KiB, "recursive_doubling", 1, 4 * MiB},  // 3.2 us
    {"1x2 shm", CollKind::kAllReduce, 64 * KiB, "recursive_doubling", 1, 4 * MiB},  // 14.7 us
    {"1x2 shm", CollKind::kAllReduce, 1 * MiB, "peer_read", 1, 4 * MiB},  // 103.7 us
    {"1x2 shm", CollKind::kAllReduce, 16 * MiB, "peer_read", 1, 4 * MiB},  // 1501.8 us
    {"1x2 shm", CollKind::kAllReduce, 256 * MiB, "peer_read", 1, 4 * MiB},  // 23956.9 us
    {"1x2 shm", CollKind::kAllGather, 8, "ring", 1, 4 * MiB},  // 3.0 us
    {"1x2 shm", CollKind::kAllGather, 1 * KiB, "ring", 1, 4 * MiB},  // 3.1 us
    {"1x2 shm", CollKind::kAllGather, 64 * KiB, "ring", 1, 4 * MiB},  // 10.3 us
    {"1x2 shm", CollKind::kAllGather, 1 * MiB, "peer_read", 1, 4 * MiB},  // 65.0 us
    {"1x2 shm", CollKind::kAllGather, 16 * MiB, "peer_read", 1, 4 * MiB},  // 938.8 us
    {"1x2 shm", CollKind::kAllGather, 256 * MiB, "peer_read", 1, 4 * MiB},  // 15009.1 us
    {"1x2 shm", CollKind::kReduceScatter, 8, "ring", 1, 4 * MiB},  // 3.0 us
    {"1x2 shm", CollKind::kReduceScatter, 1 * KiB, "ring", 1, 4 * MiB},  // 3.2 us
    {"1x2 shm", CollKind::kReduceScatter, 64 * KiB, "ring", 1, 4 * MiB},  // 14.7 us
    {"1x2 shm", CollKind::kReduceScatter, 1 * MiB, "peer_read", 1, 4 * MiB},  // 134.9 us
    {"1x2 shm", CollKind::kReduceScatter, 16 * MiB, "peer_read", 1, 4 * MiB},  // 2057.3 us
    {"1x2 shm", CollKind::kReduceScatter, 256 * MiB, "peer_read", 1, 4 * MiB},  // 32904.8 us
    {"1x2 shm", CollKind::kBroadcast, 8, "chain", 1, 4 * MiB},  // 3.0 us
    {"1x2 shm", CollKind::kBroadcast, 1 * KiB, "chain", 1, 4 * MiB},  // 3.1 us
    {"1x2 shm", CollKind::kBroadcast, 64 * KiB, "chain", 1, 4 * MiB},  // 10.3 us
    {"1x2 shm", CollKind::kBroadcast, 1 * MiB, "chain", 1, 4 * MiB},  // 119.5 us
    {"1x2 shm", CollKind::kBroadcast, 16 * MiB, "chain", 1, 4 * MiB},  // 1876.1 us
    {"1x2 shm", CollKind::kBroadcast, 256 * MiB, "chain", 1, 4 * MiB},  // 30018.2 us
    {"1x2 shm", CollKind::kReduce, 8, "chain", 1, 4 * MiB},  // 3.0 us
    {"1x2 shm", CollKind::kReduce, 1 * KiB, "chain", 1, 4 * MiB},  // 3.2 us
    {"1x2 shm", CollKind::kReduce, 64 * KiB, "chain", 1, 4 * MiB},  // 14.7 us
    {"1x2 shm", CollKind::kReduce, 1 * MiB, "chain", 1, 4 * MiB},  // 189.4 us
    {"1x2 shm", CollKind::kReduce, 16 * MiB, "chain", 1, 4 * MiB},  // 2994.6 us
    {"1x2 shm", CollKind::kReduce, 256 * MiB, "chain", 1, 4 * MiB},  // 47913.9 us
    {"1x2 shm", CollKind::kAllToAll, 8, "pairwise", 1, 4 * MiB},  // 3.0 us
    {"1x2 shm", CollKind::kAllToAll, 1 * KiB, "pairwise", 1, 4 * MiB},  // 3.1 us
    {"1x2 shm", CollKind::kAllToAll, 64 * KiB, "pairwise", 1, 4 * MiB},  // 10.3 us
    {"1x2 shm", CollKind::kAllToAll, 1 * MiB, "pairwise", 1, 4 * MiB},  // 119.5 us
    {"1x2 shm", CollKind::kAllToAll, 16 * MiB, "pairwise", 1, 4 * MiB},  // 1876.1 us
    {"1x2 shm", CollKind::kAllToAll, 256 * MiB, "pairwise", 1, 4 * MiB},  // 30018.2 us
    {"1x4 shm", CollKind::kAllReduce, 8, "one_shot", 1, 4 * MiB},  // 4.5 us
    {"1x4 shm", CollKind::kAllReduce, 1 * KiB, "one_shot", 1, 4 * MiB},  // 5.1 us
    {"1x4 shm", CollKind::kAllReduce, 64 * KiB, "peer_read", 1, 4 * MiB},  // 22.2 us
    {"1x4 shm", CollKind::kAllReduce, 1 * MiB, "peer_read", 1, 4 * MiB},  // 153.3 us
    {"1x4 shm", CollKind::kAllReduce, 16 * MiB, "peer_read", 1, 2 * MiB},  // 2255.0 us
    {"1x4 shm", CollKind::kAllReduce, 256 * MiB, "peer_read", 1, 2 * MiB},  // 36079.4 us
    {"1x4 shm", CollKind::kAllGather, 8, "one_shot", 1, 4 * MiB},  // 4.5 us
    {"1x4 shm", CollKind::kAllGather, 1 * KiB, "one_shot", 1, 4 * MiB},  // 4.9 us
    {"1x4 shm", CollKind::kAllGather, 64 * KiB, "peer_read", 1, 4 * MiB},  // 19.2 us
    {"1x4 shm", CollKind::kAllGather, 1 * MiB, "peer_read", 1, 4 * MiB},  // 183.0 us
    {"1x4 shm", CollKind::kAllGather, 16 * MiB, "peer_read", 1, 2 * MiB},  // 2832.2 us
    {"1x4 shm", CollKind::kAllGather, 256 * MiB, "peer_read", 1, 2 * MiB},  // 45315.2 us
    {"1x4 shm", CollKind::kReduceScatter, 8, "one_shot", 1, 4 * MiB},  // 4.5 us
    {"1x4 shm", CollKind::kReduceScatter, 1 * KiB, "one_shot", 1, 4 * MiB},  // 5.1 us
    {"1x4 shm", CollKind::kReduceScatter, 64 * KiB, "peer_read", 1, 4 * MiB},  // 32.3 us
    {"1x4 shm", CollKind::kReduceScatter, 1 * MiB, "peer_read", 1, 4 * MiB},  // 392.7 us
    {"1x4 shm", CollKind::kReduceScatter, 16 * MiB, "peer_read", 1, 2 * MiB},  // 6187.6 us
    {"1x4 shm", CollKind::kReduceScatter, 256 * MiB, "peer_read", 1, 2 * MiB},  // 99002.3 us
    {"1x4 shm", CollKind::kBroadcast, 8, "chain", 1, 4 * MiB},  // 9.0 us
    {"1x4 shm", CollKind::kBroadcast, 1 * KiB, "chain", 1, 4 * MiB},  // 9.3 us
    {"1x4 shm", CollKind::kBroadcast, 64 * KiB, "chain", 1, 32 * KiB},  // 26.6 us
    {"1x4 shm", CollKind::kBroadcast, 1 * MiB, "chain", 1, 128 * KiB},  // 175.6 us
    {"1x4 shm", CollKind::kBroadcast, 16 * MiB, "chain", 1, 512 * KiB},  // 2082.6 us
    {"1x4 shm", CollKind::kBroadcast, 256 * MiB, "chain", 1, 2 * MiB},  // 30682.2 us
    {"1x4 shm", CollKind::kReduce, 8, "chain", 1, 4 * MiB},  // 9.0 us
    {"1x4 shm", CollKind::kReduce, 1 * KiB, "chain", 1, 4 * MiB},  // 9.5 us
    {"1x4 shm", CollKind::kReduce, 64 * KiB, "chain", 1, 32 * KiB},  // 35.3 us
    {"1x4 shm", CollKind::kReduce, 1 * MiB, "chain", 1, 128 * KiB},  // 263.0 us
    {"1x4 shm", CollKind::kReduce, 16 * MiB, "chain", 1, 512 * KiB},  // 3271.0 us
    {"1x4 shm", CollKind::kReduce, 256 * MiB, "chain", 1, 2 * MiB},  // 48857.5 us
    {"1x4 shm", CollKind::kAllToAll, 8, "pairwise", 1, 4 * MiB},  // 9.0 us
    {"1x4 shm", CollKind::kAllToAll, 1 * KiB, "pairwise", 1, 4 * MiB},  // 9.3 us
    {"1x4 shm", CollKind::kAllToAll, 64 * KiB, "pairwise", 1, 4 * MiB},  // 30.8 us
    {"1x4 shm", CollKind::kAllToAll, 1 * MiB, "pairwise", 1, 4 * MiB},  // 358.5 us
    {"1x4 shm", CollKind::kAllToAll, 16 * MiB, "pairwise", 1, 2 * MiB},  // 5664.4 us
    {"1x4 shm", CollKind::kAllToAll, 256 * MiB, "pairwise", 1, 2 * MiB},  // 90630.5 us
    {"2x2 net+shm", CollKind::kAllReduce, 8, "recursive_doubling", 1, 4 * MiB},  // 28.0 us
    {"2x2 net+shm", CollKind::kAllReduce, 1 * KiB, "recursive_doubling", 1, 4 * MiB},  // 29.1 us
    {"2x2 net+shm", CollKind::kAllReduce, 64 * KiB, "recursive_doubling", 2, 4 * MiB},  // 64.0 us
    {"2x2 net+shm", CollKind::kAllReduce, 1 * MiB, "hierarchical", 4, 4 * MiB},  // 224.2 us
    {"2x2 net+shm", CollKind::kAllReduce, 16 * MiB, "hierarchical", 4, 512 * KiB},  // 2642.8 us
    {"2x2 net+shm", CollKind::kAllReduce, 256 * MiB, "hierarchical", 4, 4 * MiB},  // 39306.5 us
    {"2x2 net+shm", CollKind::kAllGather, 8, "hierarchical", 1, 4 * MiB},  // 28.0 us
    {"2x2 net+shm", CollKind::kAllGather, 1 * KiB, "hierarchical", 1, 4 * MiB},  // 29.2 us
    {"2x2 net+shm", CollKind::kAllGather, 64 * KiB, "hierarchical", 2, 4 * MiB},  // 65.1 us
    {"2x2 net+shm", CollKind::kAllGather, 1 * MiB, "hierarchical", 4, 4 * MiB},  // 325.1 us
    {"2x2 net+shm", CollKind::kAllGather, 16 * MiB, "hierarchical", 4, 4 * MiB},  // 4789.0 us
    {"2x2 net+shm", CollKind::kAllGather, 256 * MiB, "hierarchical", 4, 4 * MiB},  // 76623.4 us
    {"2x2 net+shm", CollKind::kReduceScatter, 8, "hierarchical", 1, 4 * MiB},  // 28.0 us
    {"2x2 net+shm", CollKind::kReduceScatter, 1 * KiB, "hierarchical", 1, 4 * MiB},  // 29.4 us
    {"2x2 net+shm", CollKind::kReduceScatter, 64 * KiB, "hierarchical", 2, 4 * MiB},  // 71.7 us
    {"2x2 net+shm", CollKind::kReduceScatter, 1 * MiB, "hierarchical", 4, 256 * KiB},  // 394.7 us
    {"2x2 net+shm", CollKind::kReduceScatter, 16 * MiB, "hierarchical", 4, 1 * MiB},  // 5143.9 us
    {"2x2 net+shm", CollKind::kReduceScatter, 256 * MiB, "hierarchical", 4, 4 * MiB},  // 77618.2 us
    {"2x2 net+shm", CollKind::kBroadcast, 8, "chain", 1, 4 * MiB},  // 75.0 us
    {"2x2 net+shm", CollKind::kBroadcast, 1 * KiB, "chain", 1, 4 * MiB},  // 77.5 us
    {"2x2 net+shm", CollKind::kBroadcast, 64 * KiB, "chain", 2, 4 * MiB},  // 153.6 us
    {"2x2 net+shm", CollKind::kBroadcast, 1 * MiB, "chain", 4, 64 * KiB},  // 464.6 us
    {"2x2 net+shm", CollKind::kBroadcast, 16 * MiB, "chain", 4, 256 * KiB},  // 4224.9 us
    {"2x2 net+shm", CollKind::kBroadcast, 256 * MiB, "chain", 4, 2 * MiB},  // 57892.5 us
    {"2x2 net+shm", CollKind::kReduce, 8, "chain", 1, 4 * MiB},  // 75.0 us
    {"2x2 net+shm", CollKind::kReduce, 1 * KiB, "chain", 1, 4 * MiB},  // 77.5 us
    {"2x2 net+shm", CollKind::kReduce, 64 * KiB, "chain", 2, 4 * MiB},  // 153.6 us
    {"2x2 net+shm", CollKind::kReduce, 1 * MiB, "chain", 4, 64 * KiB},  // 464.6 us
    {"2x2 net+shm", CollKind::kReduce, 16 * MiB, "chain", 4, 256 * KiB},  // 4224.9 us
    {"2x2 net+shm", CollKind::kReduce, 256 * MiB, "chain", 4, 2 * MiB},  // 57892.5 us
    {"2x2 net+shm", CollKind::kAllToAll, 8, "pairwise", 1, 4 * MiB},  // 75.0 us
    {"2x2 net+shm", CollKind::kAllToAll, 1 * KiB, "pairwise", 1, 4 * MiB},  // 77.5 us
    {"2x2 net+shm", CollKind::kAllToAll, 64 * KiB, "pairwise", 2, 4 * MiB},  // 153.6 us
    {"2x2 net+shm", CollKind::kAllToAll, 1 * MiB, "pairwise", 4, 4 * MiB},  // 704.1 us
    {"2x2 net+shm", CollKind::kAllToAll, 16 * MiB, "pairwise", 4, 4 * MiB},  // 10141.3 us
    {"2x2 net+shm", CollKind::kAllToAll, 256 * MiB, "pairwise", 4, 4 * MiB},  // 162261.3 us
    {"1x8 loopback", CollKind::kAllReduce, 8, "one_shot", 1, 4 * MiB},  // 2.5 us
    {"1x8 loopback", CollKind::kAllReduce, 1 * KiB, "recursive_doubling", 1, 4 * MiB},  // 3.4 us
    {"1x8 loopback", CollKind::kAllReduce, 64 * KiB, "peer_read", 1, 4 * MiB},  // 14.1 us
    {"1x8 loopback", CollKind::kAllReduce, 1 * MiB, "peer_read", 1, 4 * MiB},  // 128.8 us
    {"1x8 loopback", CollKind::kAllReduce, 16 * MiB, "peer_read", 1, 1 * MiB},  // 1971.3 us
    {"1x8 loopback", CollKind::kAllReduce, 256 * MiB, "peer_read", 1, 1 * MiB},  // 31541.5 us
    {"1x8 loopback", CollKind::kAllGather, 8, "one_shot", 1, 4 * MiB},  // 2.5 us
    {"1x8 loopback", CollKind::kAllGather, 1 * KiB, "one_shot", 1, 4 * MiB},  // 3.0 us
    {"1x8 loopback", CollKind::kAllGather, 64 * KiB, "peer_read", 1, 4 * MiB},  // 19.0 us
    {"1x8 loopback", CollKind::kAllGather, 1 * MiB, "peer_read", 1, 4 * MiB},  // 248.4 us
    {"1x8 loopback", CollKind::kAllGather, 16 * MiB, "peer_read", 1, 1 * MiB},  // 3970.7 us
    {"1x8 loopback", CollKind::kAllGather, 256 * MiB, "peer_read", 1, 1 * MiB},  // 63530.9 us
    {"1x8 loopback", CollKind::kReduceScatter, 8, "one_shot", 1, 4 * MiB},  // 2.5 us
    {"1x8 loopback", CollKind::kReduceScatter, 1 * KiB, "one_shot", 1, 4 * MiB},  // 3.5 us
    {"1x8 loopback", CollKind::kReduceScatter, 64 * KiB, "peer_read", 1, 4 * MiB},  // 49.6 us
    {"1x8 loopback", CollKind::kReduceScatter, 1 * MiB, "peer_read", 1, 4 * MiB},  // 737.8 us
    {"1x8 loopback", CollKind::kReduceScatter, 16 * MiB, "peer_read", 1, 1 * MiB},  // 11800.1 us
    {"1x8 loopback", CollKind::kReduceScatter, 256 * MiB, "peer_read", 1, 1 * MiB},  // 188800.8 us
    {"1x8 loopback", CollKind::kBroadcast, 8, "chain", 1, 4 * MiB},  // 7.0 us
    {"1x8 loopback", CollKind::kBroadcast, 1 * KiB, "chain", 1, 4 * MiB},  // 7.5 us
    {"1x8 loopback", CollKind::kBroadcast, 64 * KiB, "chain", 1, 16 * KiB},  // 20.9 us
    {"1x8 loopback", CollKind::kBroadcast, 1 * MiB, "chain", 1, 64 * KiB},  // 118.1 us
    {"1x8 loopback", CollKind::kBroadcast, 16 * MiB, "chain", 1, 256 * KiB},  // 1293.3 us
    {"1x8 loopback", CollKind::kBroadcast, 256 * MiB, "chain", 1, 1 * MiB},  // 18577.1 us
    {"1x8 loopback", CollKind::kReduce, 8, "chain", 1, 4 * MiB},  // 7.0 us
    {"1x8 loopback", CollKind::kReduce, 1 * KiB, "chain", 1, 4 * MiB},  // 8.0 us
    {"1x8 loopback", CollKind::kReduce, 64 * KiB, "chain", 1, 16 * KiB},  // 31.8 us
    {"1x8 loopback", CollKind::kReduce, 1 * MiB, "chain", 1, 32 * KiB},  // 204.0 us
    {"1x8 loopback", CollKind::kReduce, 16 * MiB, "chain", 1, 256 * KiB},  // 2516.7 us
    {"1x8 loopback", CollKind::kReduce, 256 * MiB, "chain", 1, 1 * MiB},  // 36892.3 us
    {"1x8 loopback", CollKind::kAllToAll, 8, "pairwise", 1, 4 * MiB},  // 7.0 us
    {"1x8 loopback", CollKind::kAllToAll, 1 * KiB, "pairwise", 1, 4 * MiB},  // 7.5 us
    {"1x8 loopback", CollKind::kAllToAll, 64 * KiB, "pairwise", 1, 4 * MiB},  // 37.6 us
    {"1x8 loopback", CollKind::kAllToAll, 1 * MiB, "pairwise", 1, 4 * MiB},  // 496.3 us
    {"1x8 loopback", CollKind::kAllToAll, 16 * MiB, "pairwise", 1, 1 * MiB},  // 7941.4 us
    {"1x8 loopback", CollKind::kAllToAll, 256 * MiB, "pairwise", 1, 1 * MiB},  // 127061.9 us
    {"64x16 net+shm", CollKind::kAllReduce, 8, "recursive_doubling", 1, 4 * MiB},  // 162.0 us
    {"64x16 net+shm", CollKind::kAllReduce, 1 * KiB, "recursive_doubling", 1, 4 * MiB},  // 168.3 us
    {"64x16 net+shm", CollKind::kAllReduce, 64 * KiB, "recursive_doubling", 2, 4 * MiB},  // 363.0 us
    {"64x16 net+shm", CollKind::kAllReduce, 1 * MiB, "recursive_doubling", 8, 4 * MiB},  // 1346.1 us
    {"64x16 net+shm", CollKind::kAllReduce, 16 * MiB, "hierarchical", 2, 4 * MiB},  // 7245.9 us
    {"64x16 net+shm", CollKind::kAllReduce, 256 * MiB, "hierarchical", 8, 4 * MiB},  // 27174.6 us
    {"64x16 net+shm", CollKind::kAllGather, 8, "bruck", 1, 4 * MiB},  // 354.3 us
    {"64x16 net+shm", CollKind::kAllGather, 1 * KiB, "hierarchical", 1, 4 * MiB},  // 1835.4 us
    {"64x16 net+shm", CollKind::kAllGather, 64 * KiB, "hierarchical", 8, 4 * MiB},  // 4458.1 us
    {"64x16 net+shm", CollKind::kAllGather, 1 * MiB, "hierarchical", 8, 4 * MiB},  // 38930.1 us
    {"64x16 net+shm", CollKind::kAllGather, 16 * MiB, "hierarchical", 8, 4 * MiB},  // 592704.4 us
    {"64x16 net+shm", CollKind::kAllGather, 256 * MiB, "hierarchical", 8, 4 * MiB},  // 9483270.0 us
    {"64x16 net+shm", CollKind::kReduceScatter, 8, "bruck", 1, 4 * MiB},  // 354.9 us
    {"64x16 net+shm", CollKind::kReduceScatter, 1 * KiB, "hierarchical", 1, 4 * MiB},  // 1905.3 us
    {"64x16 net+shm", CollKind::kReduceScatter, 64 * KiB, "hierarchical", 8, 4 * MiB},  // 5203.1 us
    {"64x16 net+shm", CollKind::kReduceScatter, 1 * MiB, "hierarchical", 8, 256 * KiB},  // 49963.4 us
    {"64x16 net+shm", CollKind::kReduceScatter, 16 * MiB, "hierarchical", 8, 1 * MiB},  // 641094.2 us
    {"64x16 net+shm", CollKind::kReduceScatter, 256 * MiB, "hierarchical", 8, 4 * MiB},  // 9624229.2 us
    {"64x16 net+shm", CollKind::kBroadcast, 8, "chain", 1, 4 * MiB},  // 25581.5 us
    {"64x16 net+shm", CollKind::kBroadcast, 1 * KiB, "chain", 1, 4 * MiB},  // 26413.0 us
    {"64x16 net+shm", CollKind::kBroadcast, 64 * KiB, "chain", 1, 16 * KiB},  // 39098.0 us
    {"64x16 net+shm", CollKind::kBroadcast, 1 * MiB, "chain", 2, 16 * KiB},  // 40165.0 us
    {"64x16 net+shm", CollKind::kBroadcast, 16 * MiB, "chain", 4, 16 * KiB},  // 48701.0 us
    {"64x16 net+shm", CollKind::kBroadcast, 256 * MiB, "chain", 8, 32 * KiB},  // 139712.9 us
    {"64x16 net+shm", CollKind::kReduce, 8, "chain", 1, 4 * MiB},  // 25581.5 us
    {"64x16 net+shm", CollKind::kReduce, 1 * KiB, "chain", 1, 4 * MiB},  // 26413.0 us
    {"64x16 net+shm", CollKind::kReduce, 64 * KiB, "chain", 1, 16 * KiB},  // 39098.0 us
    {"64x16 net+shm", CollKind::kReduce, 1 * MiB, "chain", 2, 16 * KiB},  // 40165.0 us
    {"64x16 net+shm", CollKind::kReduce, 16 * MiB, "chain", 4, 16 * KiB},  // 48701.0 us
    {"64x16 net+shm", CollKind::kReduce, 256 * MiB, "chain", 8, 32 * KiB},  // 139712.9 us
    {"64x16 net+shm", CollKind::kAllToAll, 8, "pairwise", 1, 4 * MiB},  // 25581.5 us
    {"64x16 net+shm", CollKind::kAllToAll, 1 * KiB, "pairwise", 1, 4 * MiB},  // 26413.0 us
    {"64x16 net+shm", CollKind::kAllToAll, 64 * KiB, "pairwise", 2, 4 * MiB},  // 52392.3 us
    {"64x16 net+shm", CollKind::kAllToAll, 1 * MiB, "pairwise", 8, 4 * MiB},  // 177125.8 us
    {"64x16 net+shm", CollKind::kAllToAll, 16 * MiB, "pairwise", 8, 4 * MiB},  // 2322512.3 us
    {"64x16 net+shm", CollKind::kAllToAll, 256 * MiB, "pairwise", 8, 4 * MiB},  // 36887396.2 us
};
// clang-format on

}  // namespace

// ---- decisions from first principles ------------------------------------------
//
// Each algorithm's estimate (collectives/registry.cc) is linear in the link
// costs, so it splits into a latency part (alpha and waits) and a bandwidth
// part (beta: bytes over the busiest link). The properties below follow from
// that split alone, whatever the tuner does with channels, segments and
// caches on top: at a latency-bound size the choice has (within the tuner's
// kMinGain tie margin) the fewest latency terms among the algorithms that
// support the shape; at a bandwidth-bound size the fewest bytes on the
// slowest link; and in between the choice is monotone in size, as the
// cheapest of costs a + b x always is: its latency terms never decrease and
// its bytes per byte never increase as x grows, so once the
// bandwidth-optimal algorithm wins it keeps winning at every larger size.

namespace {

// The estimate priced as the tuner prices it: at the slowest link the
// communicator crosses (the node's link on one node, the network across
// nodes), with what stays inside a node at the node's link (ModelContext's
// intra scales). No topology used here has more ranks than cores (no waits).
struct Pricing {
  LinkModel link;
  double intraAlpha = 1, intraBeta = 1;
};

Pricing pricingOf(const TopologySummary& s, const LinkTable& links) {
  Pricing p;
  const LinkModel& inside = linkFor(links, *s.intraNode);
  p.link = s.nnodes > 1 ? linkFor(links, *s.interNode) : inside;
  if (s.nnodes > 1) {
    p.intraAlpha = std::min(1.0, inside.alphaUs / p.link.alphaUs);
    p.intraBeta = std::min(1.0, inside.betaUsPerByte / p.link.betaUsPerByte);
  }
  return p;
}

// Microseconds of latency terms: the estimate with no byte costs.
double latencyUs(const AlgorithmEntry& e, const CollShape& shape, const RankView& view, const Pricing& p) {
  return e.estimate(shape, view, CostParams{p.link.alphaUs, 0.0, 0.0, p.intraAlpha, p.intraBeta});
}

// Microseconds of the bytes over the busiest link: the estimate with beta only.
double linkBytesUs(const AlgorithmEntry& e, const CollShape& shape, const RankView& view, const Pricing& p) {
  return e.estimate(shape, view, CostParams{0.0, p.link.betaUsPerByte, 0.0, p.intraAlpha, p.intraBeta});
}

// The algorithms that can run the shape: those the tuner runs when forced to
// (SHOAL_ALGO; one that does not apply is an error).
std::vector<const AlgorithmEntry*> supported(const TopologySummary& s, const CollShape& shape,
                                             const RankView& view) {
  std::vector<const AlgorithmEntry*> out;
  for (const AlgorithmEntry* e : candidates(shape.kind)) {
    TunerOptions forced = testOptions();
    forced.shoalAlgo = e->name;
    if (makeTuner(s, forced)->choose(shape, view).isOk()) out.push_back(e);
  }
  return out;
}

// Kinds with a choice to make (Broadcast, Reduce, AllToAll have one algorithm).
const std::vector<CollKind> kChoosingKinds = {CollKind::kAllReduce, CollKind::kAllGather,
                                              CollKind::kReduceScatter};

std::vector<uint64_t> doublingSizes() {
  std::vector<uint64_t> sizes;
  for (uint64_t b = 8; b <= 256 * MiB; b *= 2) sizes.push_back(b);
  return sizes;
}

}  // namespace

TEST_CASE("a latency-bound size takes the algorithm with the fewest latency terms", "[unit][tuner]") {
  for (const NamedTopology& t : topologies()) {
    auto tuner = makeTuner(t.summary);
    const RankView view = viewOf(t.summary);
    const Pricing p = pricingOf(t.summary, tuner->links());
    for (CollKind kind : kChoosingKinds) {
      const CollShape shape = shapeOf(kind, 8);
      auto choice = tuner->choose(shape, view);
      REQUIRE(choice.isOk());
      double fewest = INFINITY;
      std::string all;
      for (const AlgorithmEntry* e : supported(t.summary, shape, view)) {
        fewest = std::min(fewest, latencyUs(*e, shape, view, p));
        all += str(" ", e->name, " ", latencyUs(*e, shape, view, p), " us");
      }
      INFO(t.name << " " << collKindName(kind) << " 8 bytes: chose " << choice->algorithm->name
                  << "; latency terms:" << all);
      CHECK(latencyUs(*choice->algorithm, shape, view, p) <= fewest / (1 - kMinGain));
    }
  }
}

TEST_CASE("a bandwidth-bound size takes the algorithm with the fewest bytes on the slowest link", "[unit][tuner]") {
  for (const NamedTopology& t : topologies()) {
    auto tuner = makeTuner(t.summary);
    const RankView view = viewOf(t.summary);
    const Pricing p = pricingOf(t.summary, tuner->links());
    for (CollKind kind : kChoosingKinds) {
      const CollShape shape = shapeOf(kind, 256 * MiB);
      auto choice = tuner->choose(shape, view);
      REQUIRE(choice.isOk());
      double fewest = INFINITY;
      std::string all;
      for (const AlgorithmEntry* e : supported(t.summary, shape, view)) {
        fewest = std::min(fewest, linkBytesUs(*e, shape, view, p));
        all += str(" ", e->name, " ", linkBytesUs(*e, shape, view, p), " us");
      }
      INFO(t.name << " " << collKindName(kind) << " 256 MiB: chose " << choice->algorithm->name
                  << "; bytes on the busiest link:" << all);
      CHECK(linkBytesUs(*choice->algorithm, shape, view, p) <= fewest * (1 + 1e-9));
    }
  }
}

TEST_CASE("decisions are monotone in size - once the bandwidth-optimal algorithm wins it keeps winning",
          "[unit][tuner]") {
  for (const NamedTopology& t : topologies()) {
    auto tuner = makeTuner(t.summary);
    const RankView view = viewOf(t.summary);
    const Pricing p = pricingOf(t.summary, tuner->links());
    for (CollKind kind : kChoosingKinds) {
      const AlgorithmEntry* won = nullptr;  // the bandwidth-optimal algorithm, once chosen
      uint64_t wonAt = 0;
      double lastLatency = 0, lastPerByte = INFINITY;
      std::string trail;
      for (uint64_t bytes : doublingSizes()) {
        const CollShape shape = shapeOf(kind, bytes);
        auto choice = tuner->choose(shape, view);
        REQUIRE(choice.isOk());
        trail += str(" ", bytes, ":", choice->algorithm->name);
        INFO(t.name << " " << collKindName(kind) << ", choices by size:" << trail);
        // Minimizing sums of a latency and a per-byte part: as the size grows
        // the choice never trades latency terms for more bytes per byte.
        const double latency = latencyUs(*choice->algorithm, shape, view, p);
        const double perByte = linkBytesUs(*choice->algorithm, shape, view, p) / static_cast<double>(bytes);
        CHECK(latency >= lastLatency * (1 - kMinGain));
        CHECK(perByte <= lastPerByte * (1 + kMinGain));
        lastLatency = latency;
        lastPerByte = perByte;
        if (won != nullptr) {
          INFO("bandwidth-optimal " << won->name << " won at " << wonAt << " bytes");
          CHECK(choice->algorithm == won);
          continue;
        }
        const AlgorithmEntry* best = nullptr;
        for (const AlgorithmEntry* e : supported(t.summary, shape, view))
          if (best == nullptr || linkBytesUs(*e, shape, view, p) < linkBytesUs(*best, shape, view, p)) best = e;
        if (choice->algorithm == best) {
          won = best;
          wonAt = bytes;
        }
      }
      CHECK(won != nullptr);  // it wins by 256 MiB at the latest
    }
  }
}

// ---- recorded decision table (a change detector) ------------------------------
//
// kGolden is what the tuner decided when it was recorded: a change detector,
// not a proof of correctness (the properties above are that).

TEST_CASE("tuner decisions are unchanged from the recorded table (change detector)", "[unit][tuner]") {
  REQUIRE(kGolden.size() == topologies().size() * kKinds.size() * kSizes.size());
  for (const NamedTopology& t : topologies()) {
    auto tuner = makeTuner(t.summary);
    const RankView view = viewOf(t.summary);
    for (const GoldenRow& row : kGolden) {
      if (std::string(row.topology) != t.name) continue;
      auto choice = tuner->choose(shapeOf(row.kind, row.bytes), view);
      REQUIRE(choice.isOk());
      INFO(t.name << " " << collKindName(row.kind) << " " << row.bytes << " bytes");
      CHECK(std::string(choice->algorithm->name) == row.algorithm);
      CHECK(choice->params.channels == row.channels);
      CHECK(choice->params.segmentBytes == row.segmentBytes);
    }
  }
}

TEST_CASE("print the recorded decision table", "[.print]") {
  for (const NamedTopology& t : topologies()) {
    auto tuner = makeTuner(t.summary);
    const RankView view = viewOf(t.summary);
    for (CollKind kind : kKinds) {
      for (uint64_t bytes : kSizes) {
        auto choice = tuner->choose(shapeOf(kind, bytes), view);
        REQUIRE(choice.isOk());
        auto us = tuner->estimateUs(shapeOf(kind, bytes), view);
        std::printf("{\"%s\", CollKind::%s, %s, \"%s\", %d, %s},  // %.1f us\n", t.name,
                    kindIdentifier(kind).c_str(), bytesIdentifier(bytes).c_str(),
                    choice->algorithm->name, choice->params.channels,
                    bytesIdentifier(choice->params.segmentBytes).c_str(), us.value());
      }
    }
  }
}

// ---- cost model properties ----------------------------------------------------

TEST_CASE("copy links never gain from channels - the network does", "[unit][tuner]") {
  const RankView view = viewOf(4);
  for (uint64_t bytes : kSizes) {
    auto shm = makeTuner(summary(1, 4, LinkClass::kShm, LinkClass::kNet, smallMachine(64)));
    CHECK(shm->choose(shapeOf(CollKind::kAllReduce, bytes), view)->params.channels == 1);
  }
  auto net = makeTuner(summary(4, 1, LinkClass::kShm, LinkClass::kNet, smallMachine(8)));
  CHECK(net->choose(shapeOf(CollKind::kAllReduce, 8), view)->params.channels == 1);
  CHECK(net->choose(shapeOf(CollKind::kAllReduce, 256 * MiB), view)->params.channels == 8);
  // One core per rank: no spare core drives a second stream.
  auto busy = makeTuner(summary(4, 1, LinkClass::kShm, LinkClass::kNet, smallMachine(1)));
  CHECK(busy->choose(shapeOf(CollKind::kAllReduce, 256 * MiB), view)->params.channels == 1);
}

TEST_CASE("shm segments fit the cache share - no cache means large segments", "[unit][tuner]") {
  const RankView view = viewOf(4);
  auto cached = makeTuner(summary(1, 4, LinkClass::kShm, LinkClass::kNet, smallMachine(4)));
  uint64_t segment = cached->choose(shapeOf(CollKind::kAllReduce, 256 * MiB), view)->params.segmentBytes;
  CHECK(kSegmentsInFlight * segment <= 32 * MiB / 4);
  MachineTopology noCache = smallMachine(4);
  noCache.l2Bytes = noCache.l3Bytes = 0;
  auto uncached = makeTuner(summary(1, 4, LinkClass::kShm, LinkClass::kNet, noCache));
  CHECK(uncached->choose(shapeOf(CollKind::kAllReduce, 256 * MiB), view)->params.segmentBytes ==
        4 * MiB);
}

TEST_CASE("across nodes an AllReduce ring keeps its pieces in the L2 - ReduceScatter and AllGather do not need to",
          "[unit][tuner]") {
  // 2 nodes x 1 rank, the development VM's shape: a 1 MiB L2 and an L3 so
  // large (a hypervisor reporting the host's) that it must not count for
  // data from the network.
  MachineTopology vm = smallMachine(2);
  vm.l3Bytes = 508 * MiB;
  // And its link table (cost_model.cc's figures, copied so that a new
  // calibration does not move this test; measured 2026-11-30 on this VM:
  // 128 KiB pieces took 23-52 ms where 4 MiB took 51-70 at 64 MiB over tcp,
  // docs/decisions/0008).
  TunerOptions options = testOptions();
  options.links[static_cast<size_t>(LinkClass::kShm)] = {1.04, 1.0 / 4855.0, 1.0 / 10271.0};
  options.links[static_cast<size_t>(LinkClass::kNet)] = {7.15, 1.0 / 2400.0, 1.0 / 10271.0};
  TopologySummary twoNodes = over(summary(2, 1, LinkClass::kShm, LinkClass::kNet, vm), "tcp", true);
  auto tuner = makeTuner(twoNodes, options);
  const RankView view = viewOf(twoNodes);
  auto inFlight = [](const TunerChoice& c) {
    return kSegmentsInFlight * static_cast<uint64_t>(c.params.channels) * c.params.segmentBytes;
  };
  auto allReduce = tuner->choose(shapeOf(CollKind::kAllReduce, 64 * MiB), view);
  REQUIRE(allReduce.isOk());
  CHECK(allReduce->algorithm->name == std::string("ring"));
  CHECK(inFlight(*allReduce) <= vm.l2Bytes);
  // And below 128 KiB (decision 0008: 128 KiB pieces ran 1.3-2x slower).
  CHECK(allReduce->params.segmentBytes == kSocketPieceMaxBytes);
  for (CollKind kind : {CollKind::kReduceScatter, CollKind::kAllGather}) {
    auto choice = tuner->choose(shapeOf(kind, 64 * MiB), view);
    REQUIRE(choice.isOk());
    CHECK(inFlight(*choice) > vm.l2Bytes);
  }
  // libfabric's tcp provider copies through the CPU too (decision 0007), but
  // pays kSocketProviderMessageUs more per message (decision 0008,
  // amendment 1): in-cache pieces up to a few MiB, large ones above.
  auto overOfiSockets = makeTuner(over(twoNodes, "ofi", true), options);
  auto ofiAt4 = overOfiSockets->choose(shapeOf(CollKind::kAllReduce, 4 * MiB), view);
  REQUIRE(ofiAt4.isOk());
  CHECK(ofiAt4->params.segmentBytes == kSocketPieceMaxBytes);
  auto ofiAt16 = overOfiSockets->choose(shapeOf(CollKind::kAllReduce, 16 * MiB), view);
  REQUIRE(ofiAt16.isOk());
  CHECK(ofiAt16->params.segmentBytes >= 2 * MiB);
  auto ofiAt64 = overOfiSockets->choose(shapeOf(CollKind::kAllReduce, 64 * MiB), view);
  REQUIRE(ofiAt64.isOk());
  CHECK(ofiAt64->params.segmentBytes >= 2 * MiB);
  // Shoal's tcp transport keeps them at every size.
  auto tcpAt16 = tuner->choose(shapeOf(CollKind::kAllReduce, 16 * MiB), view);
  REQUIRE(tcpAt16.isOk());
  CHECK(tcpAt16->params.segmentBytes == kSocketPieceMaxBytes);
  // Through kernel sockets no collective takes 128 KiB segments (messages of
  // exactly 128 KiB stalled, decision 0008, amendment 2): the
  // ReduceScatter of 1 MiB (512 KiB per rank), which took them, takes 120 KiB.
  for (const char* transport : {"tcp", "ofi"}) {
    auto overSockets = makeTuner(over(twoNodes, transport, true), options);
    for (CollKind kind : {CollKind::kAllReduce, CollKind::kReduceScatter, CollKind::kAllGather})
      for (uint64_t bytes = 64 * KiB; bytes <= 64 * MiB; bytes *= 2) {
        auto choice = overSockets->choose(shapeOf(kind, bytes), view);
        REQUIRE(choice.isOk());
        INFO(transport << " " << collKindName(kind) << " " << bytes);
        CHECK(choice->params.segmentBytes != kSocketPieceStallBytes);
      }
  }
  auto reduceScatter1M = tuner->choose(shapeOf(CollKind::kReduceScatter, 512 * KiB), view);
  REQUIRE(reduceScatter1M.isOk());
  CHECK(reduceScatter1M->params.segmentBytes == kSocketPieceMaxBytes);
  // Over a NIC that moves the bytes, large pieces stay.
  auto overNic =
      makeTuner(over(twoNodes, "ofi", false), options)->choose(shapeOf(CollKind::kAllReduce, 64 * MiB), view);
  REQUIRE(overNic.isOk());
  CHECK(inFlight(*overNic) > vm.l2Bytes);
}

TEST_CASE("candidate cost follows the documented formula", "[unit][tuner]") {
  AlgorithmTerms terms{6, 3.0 * MiB, 1.5 * MiB};  // ring AllReduce, 4 ranks, 2 MiB
  ModelContext ctx;
  ctx.link = {2.0, 1.0 / 1000.0, 1.0 / 4000.0};
  ctx.copyLink = false;
  ctx.streams = 2;
  ctx.cacheShareBytes = 0;
  // One piece per message: 6 alpha + transfer + reduce, nothing overlaps.
  double whole = 6 * 2.0 + 3.0 * MiB / 1000.0 + 1.5 * MiB / 4000.0;
  CHECK(candidateCostUs(terms, ctx, {1, 4 * MiB}) == Approx(whole));
  // Four pieces per message: 24 alpha, the reduction hides behind the transfer but one piece.
  double piecewise = 24 * 2.0 + 3.0 * MiB / 1000.0 + 1.5 * MiB / 4000.0 / 4;
  CHECK(candidateCostUs(terms, ctx, {1, 128 * KiB}) == Approx(piecewise));
  // More channels than streams: the channels share the streams.
  CHECK(candidateCostUs(terms, ctx, {4, 4 * MiB}) == Approx(2 * whole));
  // Copy link, cache-resident pieces: bytes move and reduce kCacheSpeedup faster.
  ctx.copyLink = true;
  ctx.cacheShareBytes = 1 * MiB;
  double cached = 24 * 2.0 + (3.0 * MiB / 1000.0 + 1.5 * MiB / 4000.0) / kCacheSpeedup;
  CHECK(candidateCostUs(terms, ctx, {1, 128 * KiB}) == Approx(cached));
  // Net through Shoal's tcp, cache-resident pieces: only the bytes reduced
  // and then sent on (min(G, B - G), the ring's second half) leave from
  // cache; the reduction runs from cache and hides behind the transfer but
  // one piece.
  ModelContext net = ctx;
  net.copyLink = false;
  net.netSendsFromCache = true;
  double hotTransfer = (1.5 * MiB + 1.5 * MiB / kCacheSpeedup) / 1000.0;
  CHECK(candidateCostUs(terms, net, {1, 64 * KiB}) ==
        Approx(48 * 2.0 + hotTransfer + 1.5 * MiB / 4000.0 / kCacheSpeedup / 8));
  // Every channel holds kSegmentsInFlight pieces: 8 channels of 64 KiB
  // pieces (2 MiB) no longer fit 1 MiB (and share the 2 streams).
  CHECK(candidateCostUs(terms, net, {8, 64 * KiB}) ==
        Approx(4 * (48 * 2.0 + 3.0 * MiB / 1000.0 + 1.5 * MiB / 4000.0 / 8)));
  // Through kernel sockets a piece above kSocketPieceMaxBytes gets no credit
  // for its sends, though 4 x 128 KiB would fit; its reduction keeps it.
  CHECK(candidateCostUs(terms, net, {1, 128 * KiB}) ==
        Approx(24 * 2.0 + 3.0 * MiB / 1000.0 + 1.5 * MiB / 4000.0 / kCacheSpeedup / 4));
  // ReduceScatter (G = B): nothing reduced is sent on, so no byte leaves from cache.
  AlgorithmTerms scatter{3, 1.5 * MiB, 1.5 * MiB};
  CHECK(candidateCostUs(scatter, net, {1, 64 * KiB}) ==
        Approx(24 * 2.0 + 1.5 * MiB / 1000.0 + 1.5 * MiB / 4000.0 / kCacheSpeedup / 8));
  CHECK(candidateCostUs(scatter, net, {1, 128 * KiB}) ==
        Approx(12 * 2.0 + 1.5 * MiB / 1000.0 + 1.5 * MiB / 4000.0 / kCacheSpeedup / 4));
  // Any other net transport: every byte at beta.
  net.netSendsFromCache = false;
  CHECK(candidateCostUs(terms, net, {1, 128 * KiB}) ==
        Approx(24 * 2.0 + 3.0 * MiB / 1000.0 + 1.5 * MiB / 4000.0 / kCacheSpeedup / 4));
  // A chain of 3 hops in 4 pieces: 3 - 1 + 4 stages of one piece each.
  ModelContext chain = ctx;
  chain.cacheShareBytes = 0;
  chain.pipelineHops = 3;
  AlgorithmTerms broadcast{3, 1.0 * MiB, 0};
  CHECK(candidateCostUs(broadcast, chain, {1, 256 * KiB}) == Approx(6 * (2.0 + 256 * KiB / 1000.0)));
  // Splitting messages below alpha/beta (2 KB here) over channels is never chosen.
  AlgorithmTerms tiny{6, 6.0 * KiB, 0};
  CHECK(std::isinf(candidateCostUs(tiny, ctx, {2, 4 * MiB})));
  // Oversubscribed: each of W waited-for messages costs waitUs more, spread
  // over the M messages of the critical path (and paid once per piece).
  ModelContext crowded = ctx;
  crowded.cacheShareBytes = 0;
  crowded.waitUs = 5.0;
  AlgorithmTerms rounds{3, 0, 0, 9};  // three rounds waiting on three peers each
  CHECK(candidateCostUs(rounds, crowded, {1, 4 * MiB}) == Approx(3 * 2.0 + 9 * 5.0));
  // Over ofi through kernel sockets each of the N messages that cross the
  // network costs netMessageSurchargeUs more, per piece; inside-node ones not.
  ModelContext ofi = ctx;
  ofi.copyLink = false;
  ofi.cacheShareBytes = 0;
  ofi.netMessageSurchargeUs = 5.0;
  AlgorithmTerms mixed = terms;
  mixed.netMessages = 2;  // of the 6
  CHECK(candidateCostUs(mixed, ofi, {1, 4 * MiB}) == Approx(whole + 2 * 5.0));
  CHECK(candidateCostUs(mixed, ofi, {1, 128 * KiB}) == Approx(piecewise + 4 * 2 * 5.0));
}

TEST_CASE("decompose counts the messages that cross the network apart from those inside a node", "[unit][tuner]") {
  MachineTopology vm = smallMachine(2);
  TopologySummary twoByTwo = summary(2, 2, LinkClass::kShm, LinkClass::kNet, vm);
  const RankView view = viewOf(twoByTwo);
  const CollShape shape = shapeOf(CollKind::kAllReduce, 8);
  ModelContext ctx;
  ctx.intraAlphaScale = 0.2;
  ctx.intraBetaScale = 0.5;
  // Without a surcharge nothing needs N.
  const AlgorithmEntry* hierarchical = findAlgorithm(CollKind::kAllReduce, "hierarchical");
  REQUIRE(hierarchical != nullptr);
  CHECK(decompose(*hierarchical, shape, view, ctx).netMessages == 0);
  ctx.netMessageSurchargeUs = kSocketProviderMessageUs;
  const AlgorithmTerms split = decompose(*hierarchical, shape, view, ctx);
  // The node phases are messages at 0.2 in M and none in N; the rail phase
  // is in both.
  CHECK(split.netMessages > 0);
  CHECK(split.netMessages < split.messages);
  ctx.intraAlphaScale = 1.0;
  const AlgorithmTerms flat = decompose(*hierarchical, shape, view, ctx);
  CHECK(flat.netMessages == Approx(split.netMessages));
  CHECK(flat.messages > split.messages);
}

TEST_CASE("oversubscribed nodes prefer fewer rounds - peer reads wait on every peer", "[unit][tuner]") {
  // Registry estimates: a peer_read round waits on all p - 1 peers.
  const AlgorithmEntry* peerRead = findAlgorithm(CollKind::kAllReduce, "peer_read");
  const AlgorithmEntry* rd = findAlgorithm(CollKind::kAllReduce, "recursive_doubling");
  RankView four = viewOf(4);
  four.peerReads = true;
  const CollShape shape = shapeOf(CollKind::kAllReduce, 64 * KiB);
  ModelContext plain;
  AlgorithmTerms pr = decompose(*peerRead, shape, four, plain);
  CHECK(pr.waits == Approx(3 * 3));  // three rounds, three peers each
  CHECK(pr.messages < pr.waits);     // on the critical path: three rounds and the read setups
  CHECK(decompose(*rd, shape, four, plain).waits == Approx(2));
  // 4 ranks on 4 cores read their peers at 64 KiB; on 2 cores the waits
  // make recursive doubling's two rounds cheaper; large sizes still read.
  TopologySummary roomy = summary(1, 4, LinkClass::kShm, LinkClass::kNet, smallMachine(4));
  TopologySummary crowded = summary(1, 4, LinkClass::kShm, LinkClass::kNet, smallMachine(2));
  CHECK(std::string(makeTuner(roomy)->choose(shape, viewOf(roomy))->algorithm->name) == "peer_read");
  CHECK(std::string(makeTuner(crowded)->choose(shape, viewOf(crowded))->algorithm->name) ==
        "recursive_doubling");
  CHECK(std::string(makeTuner(crowded)->choose(shapeOf(CollKind::kAllReduce, 16 * MiB), viewOf(crowded))
                        ->algorithm->name) == "peer_read");
}

TEST_CASE("oversubscribed nodes share the cores' copy speed among their ranks", "[unit][tuner]") {
  // 4 ranks on 2 cores take turns copying: every byte costs twice what it
  // costs with a core each, so a bandwidth-bound size costs about twice as much.
  TopologySummary roomy = summary(1, 4, LinkClass::kShm, LinkClass::kNet, smallMachine(4));
  TopologySummary crowded = summary(1, 4, LinkClass::kShm, LinkClass::kNet, smallMachine(2));
  const CollShape big = shapeOf(CollKind::kAllGather, 16 * MiB);
  TunerOptions o = testOptions();
  o.shoalAlgo = "ring";
  auto roomyUs = Tuner::create(roomy, o).value()->estimateUs(big, viewOf(roomy));
  auto crowdedUs = Tuner::create(crowded, o).value()->estimateUs(big, viewOf(crowded));
  REQUIRE(roomyUs.isOk());
  REQUIRE(crowdedUs.isOk());
  CHECK(crowdedUs.value() == Approx(2 * roomyUs.value()).epsilon(0.05));
  // Measured on the 2-core development VM (2026-11-30):
  // AllGather and ReduceScatter with 32 KiB per rank read their peers (ring
  // and Bruck copy every byte twice through the rings: 1.4-1.6x slower).
  for (CollKind kind : {CollKind::kAllGather, CollKind::kReduceScatter}) {
    INFO(collKindName(kind));
    CHECK(std::string(makeTuner(crowded)->choose(shapeOf(kind, 32 * KiB), viewOf(crowded))->algorithm->name) ==
          "peer_read");
  }
}

TEST_CASE("forced segment size and channel bounds are honoured", "[unit][tuner]") {
  TunerOptions o = testOptions();
  o.segmentBytes = 256 * KiB;
  o.minChannels = 3;
  o.maxChannels = 3;
  auto tuner = makeTuner(topologies()[2].summary, o);
  auto choice = tuner->choose(shapeOf(CollKind::kAllReduce, 64 * MiB), viewOf(4));
  REQUIRE(choice.isOk());
  CHECK(choice->params.segmentBytes == 256 * KiB);
  CHECK(choice->params.channels == 3);
}

// ---- overrides: NCCL_ALGO, SHOAL_ALGO, SHOAL_TUNER_FILE ---------------------------

TEST_CASE("NCCL_ALGO and SHOAL_ALGO: bad names are init errors, good ones steer", "[unit][tuner]") {
  const TopologySummary s = topologies()[1].summary;
  {
    TunerOptions o = testOptions();
    o.algo = "Ring,Bogus";
    auto tuner = Tuner::create(s, o);
    REQUIRE_FALSE(tuner.isOk());
    CHECK(tuner.status().code() == Code::kInvalidArgument);
    CHECK_THAT(tuner.status().message(), Catch::Contains("'bogus'"));
  }
  {
    TunerOptions o = testOptions();
    o.shoalAlgo = "quantum";
    auto tuner = Tuner::create(s, o);
    REQUIRE_FALSE(tuner.isOk());
    CHECK_THAT(tuner.status().message(), Catch::Contains("SHOAL_ALGO=quantum"));
  }
  {
    TunerOptions o = testOptions();
    o.algo = "Tree";  // recursive doubling even where ring is cheaper
    auto choice = makeTuner(s, o)->choose(shapeOf(CollKind::kAllReduce, 256 * MiB), viewOf(4));
    CHECK(std::string(choice->algorithm->name) == "recursive_doubling");
  }
  {
    TunerOptions o = testOptions();
    o.shoalAlgo = "ring";
    auto choice = makeTuner(s, o)->choose(shapeOf(CollKind::kAllReduce, 8), viewOf(4));
    CHECK(std::string(choice->algorithm->name) == "ring");
  }
  // Through the environment, as the communicator creates it.
  setenv("NCCL_ALGO", "Ring;Nope", 1);
  reloadParams();
  auto fromEnv = Tuner::create(s, 0, 0);
  unsetenv("NCCL_ALGO");
  reloadParams();
  REQUIRE_FALSE(fromEnv.isOk());
  CHECK_THAT(fromEnv.status().message(), Catch::Contains("NCCL_ALGO=Ring;Nope"));
}

// NCCL_ALGO as NCCL reads it: '^' excludes NCCL's algorithms (not Shoal's
// names they share), per-collective entries override the first, and only
// Broadcast, Reduce, AllGather, ReduceScatter and AllReduce are affected.
TEST_CASE("NCCL_ALGO: exclusion, per-collective entries, the collectives it leaves alone", "[unit][tuner]") {
  const TopologySummary s = topologies()[1].summary;
  auto pick = [&](const std::string& algo, CollKind kind, uint64_t bytes) -> std::string {
    TunerOptions o = testOptions();
    o.algo = algo;
    CollShape shape = shapeOf(kind, bytes);
    auto choice = makeTuner(s, o)->choose(shape, viewOf(4));
    return choice.isOk() ? std::string(choice->algorithm->name) : "error: " + choice.status().message();
  };
  for (CollKind kind : {CollKind::kBroadcast, CollKind::kReduce, CollKind::kAllToAll, CollKind::kGather,
                        CollKind::kScatter, CollKind::kAllGather, CollKind::kReduceScatter}) {
    INFO(collKindName(kind));
    for (const char* algo : {"^tree", "^Ring", "ring", "tree"}) {
      INFO("NCCL_ALGO=" << algo);
      CHECK(pick(algo, kind, 64 * KiB).rfind("error", 0) == std::string::npos);
    }
  }
  CHECK(pick("^tree", CollKind::kAllReduce, 256 * MiB) == "ring");
  CHECK(pick("^ring", CollKind::kAllReduce, 256 * MiB) == "recursive_doubling");
  // Per collective: AllReduce on Tree, the others as the first entry says.
  CHECK(pick("ring;allreduce:tree", CollKind::kAllReduce, 256 * MiB) == "recursive_doubling");
  CHECK(pick("ring;allreduce:tree", CollKind::kAllGather, 8) == "ring");
  CHECK(pick("allreduce:^ring", CollKind::kAllGather, 8).rfind("error", 0) == std::string::npos);
  // Algorithms no NCCL name stands for stay under an exclusion: "^nvls"
  // (a common setting) takes nothing away; a positive list leaves them out.
  {
    const TopologySummary twoNodes = topologies()[2].summary;  // 2x2 net+shm: hierarchical wins at 1 MiB
    TunerOptions o = testOptions();
    auto unset = makeTuner(twoNodes, o)->choose(shapeOf(CollKind::kAllReduce, 1 * MiB), viewOf(twoNodes));
    REQUIRE(unset.isOk());
    REQUIRE(std::string(unset->algorithm->name) == "hierarchical");
    o.algo = "^nvls";
    auto excluded = makeTuner(twoNodes, o)->choose(shapeOf(CollKind::kAllReduce, 1 * MiB), viewOf(twoNodes));
    REQUIRE(excluded.isOk());
    CHECK(std::string(excluded->algorithm->name) == "hierarchical");
    o.algo = "ring,tree";
    auto listed = makeTuner(twoNodes, o)->choose(shapeOf(CollKind::kAllReduce, 1 * MiB), viewOf(twoNodes));
    REQUIRE(listed.isOk());
    CHECK(std::string(listed->algorithm->name) != "hierarchical");
  }
  // Nothing left for Broadcast; AlltoAll is not NCCL_ALGO's.
  CHECK(pick("^ring,tree", CollKind::kBroadcast, 64).find("NCCL_ALGO was set to ^ring,tree") != std::string::npos);
  CHECK(pick("^ring,tree", CollKind::kAllToAll, 64).rfind("error", 0) == std::string::npos);
  // An entry after the first without its collective, or an unknown one, is an init error.
  for (const char* bad : {"ring;tree", "allreduce:ring;sendrecv:tree"}) {
    INFO(bad);
    TunerOptions o = testOptions();
    o.algo = bad;
    auto tuner = Tuner::create(s, o);
    REQUIRE_FALSE(tuner.isOk());
    CHECK(tuner.status().code() == Code::kInvalidArgument);
  }
}

TEST_CASE("a forced algorithm that cannot run is an error - never a silent substitute", "[unit][tuner]") {
  // One node: hierarchical does not apply (it needs several nodes).
  const TopologySummary oneNode = summary(1, 4, LinkClass::kShm, LinkClass::kNet, smallMachine(4));
  {
    TunerOptions o = testOptions();
    o.shoalAlgo = "hierarchical";
    auto tuner = makeTuner(oneNode, o);
    auto choice = tuner->choose(shapeOf(CollKind::kAllReduce, 8), viewOf(oneNode));
    REQUIRE_FALSE(choice.isOk());
    CHECK(choice.status().code() == Code::kInvalidUsage);
    CHECK_THAT(choice.status().message(), Catch::Contains("SHOAL_ALGO=hierarchical cannot run AllReduce of 8 bytes"));
    CHECK_FALSE(tuner->estimateUs(shapeOf(CollKind::kAllReduce, 8), viewOf(oneNode)).isOk());
    // Send/Recv have one algorithm: SHOAL_ALGO does not apply to them.
    CollShape send = shapeOf(CollKind::kSend, 64);
    send.peer = 1;
    CHECK(tuner->choose(send, viewOf(oneNode)).isOk());
  }
  {
    // one_shot is offered up to 16 KiB: beyond, forcing it fails.
    TunerOptions o = testOptions();
    o.shoalAlgo = "one_shot";
    auto tuner = makeTuner(oneNode, o);
    auto small = tuner->choose(shapeOf(CollKind::kAllReduce, 1 * KiB), viewOf(oneNode));
    REQUIRE(small.isOk());
    CHECK(std::string(small->algorithm->name) == "one_shot");
    CHECK(tuner->choose(shapeOf(CollKind::kAllReduce, 64 * MiB), viewOf(oneNode)).status().code() ==
          Code::kInvalidUsage);
  }
  {
    // A name with no algorithm for this collective: the tuner's choice (one WARN).
    TunerOptions o = testOptions();
    o.shoalAlgo = "bruck";
    auto choice = makeTuner(oneNode, o)->choose(shapeOf(CollKind::kAllReduce, 1 * KiB), viewOf(oneNode));
    REQUIRE(choice.isOk());
    CHECK(std::string(choice->algorithm->name) != "bruck");
  }
  {
    // NCCL_ALGO naming only algorithms Shoal does not have leaves nothing:
    // ncclInvalidUsage, as NCCL ("NCCL_ALGO was set to ...").
    TunerOptions o = testOptions();
    o.algo = "NVLS";
    auto choice = makeTuner(oneNode, o)->choose(shapeOf(CollKind::kAllReduce, 1 * KiB), viewOf(oneNode));
    REQUIRE_FALSE(choice.isOk());
    CHECK(choice.status().code() == Code::kInvalidUsage);
    CHECK_THAT(choice.status().message(), Catch::Contains("NCCL_ALGO was set to NVLS"));
  }
}

TEST_CASE("SHOAL_TUNER_FILE parsing", "[unit][tuner]") {
  const LinkTable base = testLinks();
  SECTION("a good file overrides the classes it lists") {
    auto t = parseLinkTable("# measured\n\nshm 2.5 12 20   # comment\nnet 40 1.25 8\n", "f", base);
    REQUIRE(t.isOk());
    CHECK(linkFor(*t, LinkClass::kShm).alphaUs == 2.5);
    CHECK(linkFor(*t, LinkClass::kShm).betaUsPerByte == Approx(1.0 / 12000.0));
    CHECK(linkFor(*t, LinkClass::kShm).gammaUsPerByte == Approx(1.0 / 20000.0));
    CHECK(linkFor(*t, LinkClass::kNet).alphaUs == 40);
    CHECK(linkFor(*t, LinkClass::kLoopback).alphaUs == linkFor(base, LinkClass::kLoopback).alphaUs);
  }
  SECTION("the formatted table parses back to itself") {
    auto t = parseLinkTable(formatLinkTable(base), "f", LinkTable{});
    REQUIRE(t.isOk());
    for (int c = 0; c < kLinkClassCount; ++c) {
      CHECK((*t)[c].alphaUs == Approx(base[c].alphaUs));
      CHECK((*t)[c].betaUsPerByte == Approx(base[c].betaUsPerByte).epsilon(1e-3));
    }
  }
  SECTION("malformed lines are errors naming the line") {
    struct Bad {
      const char* text;
      const char* message;
    };
    for (const Bad& bad : std::vector<Bad>{
             {"shm 1 2 3\nfabric 1 2 3\n", "f line 2: unknown link class 'fabric'"},
             {"\n\nshm 1 2\n", "f line 3: expected three numbers after 'shm'"},
             {"net 1 2 x\n", "f line 1: expected three numbers"},
             {"net 1 2 3 4\n", "f line 1: unexpected '4'"},
             {"loopback -1 2 3\n", "f line 1: alpha_us must be >= 0"},
             {"loopback 1 0 3\n", "f line 1: beta_GBps must be > 0"},
             {"loopback 1 2 -2\n", "f line 1: gamma_GBps must be > 0"},
         }) {
      auto t = parseLinkTable(bad.text, "f", base);
      REQUIRE_FALSE(t.isOk());
      CHECK(t.status().code() == Code::kInvalidArgument);
      CHECK_THAT(t.status().message(), Catch::Contains(bad.message));
    }
  }
  SECTION("through the environment, a bad file fails tuner creation") {
    const char* path = "/tmp/shoal_tuner_test_links.txt";
    {
      std::ofstream out(path);
      out << "shm 2 10 20\nnet 30 1.5\n";
    }
    setenv("SHOAL_TUNER_FILE", path, 1);
    reloadParams();
    auto tuner = Tuner::create(topologies()[0].summary, 0, 0);
    unsetenv("SHOAL_TUNER_FILE");
    reloadParams();
    std::remove(path);
    REQUIRE_FALSE(tuner.isOk());
    CHECK_THAT(tuner.status().message(),
               Catch::Contains("SHOAL_TUNER_FILE=/tmp/shoal_tuner_test_links.txt line 2"));
    setenv("SHOAL_TUNER_FILE", "/nonexistent/links.txt", 1);
    reloadParams();
    auto missing = Tuner::create(topologies()[0].summary, 0, 0);
    unsetenv("SHOAL_TUNER_FILE");
    reloadParams();
    REQUIRE_FALSE(missing.isOk());
    CHECK_THAT(missing.status().message(), Catch::Contains("cannot open"));
  }
}

// ---- topology subgroups -------------------------------------------------------

namespace {
std::vector<PeerInfo> peersOnHosts(const std::vector<std::string>& hosts) {
  std::vector<PeerInfo> peers(hosts.size());
  for (size_t r = 0; r < hosts.size(); ++r) {
    peers[r].rank = static_cast<int>(r);
    peers[r].hostId = hosts[r];
    peers[r].hostname = hosts[r];
  }
  return peers;
}
}  // namespace

TEST_CASE("topology: nodes, leaders and rails with uneven nodes", "[unit][topology]") {
  // Node a: ranks 0, 1, 3; node b: rank 2; node c: ranks 4, 5.
  Topology t = buildTopology(peersOnHosts({"a", "a", "b", "a", "c", "c"}));
  using V = std::vector<int>;
  CHECK(t.nodes == std::vector<V>{{0, 1, 3}, {2}, {4, 5}});
  CHECK(t.nodeOfRank == V{0, 0, 1, 0, 2, 2});
  CHECK(t.localRankOfRank == V{0, 1, 0, 2, 0, 1});
  CHECK(t.leaders == V{0, 2, 4});
  CHECK(t.rails == std::vector<V>{{0, 2, 4}, {1, 5}, {3}});  // node b has no rail 1 or 2
  CHECK(t.ring == V{0, 1, 3, 2, 4, 5});
  CHECK(t.nodeOf(3) == V{0, 1, 3});
  CHECK(t.railOf(5) == V{1, 5});
  CHECK(t.localRank(3) == 2);
  CHECK(t.maxRanksPerNode() == 3);
  CHECK(t.minRanksPerNode() == 1);
  CHECK(t.sameNode(0, 3));
  CHECK_FALSE(t.sameNode(0, 2));
}

TEST_CASE("topology: one node, and one rank per node", "[unit][topology]") {
  Topology one = buildTopology(peersOnHosts({"a", "a", "a", "a"}));
  CHECK(one.leaders == std::vector<int>{0});
  CHECK(one.rails.size() == 4);
  CHECK(one.rails[3] == std::vector<int>{3});
  Topology spread = buildTopology(peersOnHosts({"a", "b", "c"}));
  CHECK(spread.leaders == std::vector<int>{0, 1, 2});
  CHECK(spread.rails == std::vector<std::vector<int>>{{0, 1, 2}});
}

TEST_CASE("topology summary classifies fixed pairs only", "[unit][topology]") {
  Topology t = buildTopology(peersOnHosts({"a", "a", "b", "a", "c", "c"}));
  std::vector<std::pair<int, int>> asked;
  auto classify = [&](int a, int b) {
    asked.emplace_back(a, b);
    return t.sameNode(a, b) ? LinkClass::kShm : LinkClass::kNet;
  };
  TopologySummary s = summarizeTopology(t, classify, false, smallMachine(4));
  CHECK(s.nranks == 6);
  CHECK(s.nnodes == 3);
  CHECK(s.maxRanksPerNode == 3);
  CHECK(s.minRanksPerNode == 1);
  CHECK(s.intraNode == LinkClass::kShm);
  CHECK(s.interNode == LinkClass::kNet);
  CHECK(s.machine->cores == 4);
  CHECK(asked == std::vector<std::pair<int, int>>{{0, 1}, {4, 5}, {0, 2}, {0, 4}});
  // Each transport states its class; the communicator's classifier reads it.
  CHECK(findTransport("loopback")->linkClass() == LinkClass::kLoopback);
  CHECK(findTransport("shm")->linkClass() == LinkClass::kShm);
  CHECK(findTransport("tcp")->linkClass() == LinkClass::kNet);
  CHECK(findTransport("ofi")->linkClass() == LinkClass::kNet);
}

// ---- machine discovery --------------------------------------------------------

TEST_CASE("machine discovery finds plausible facts", "[unit][topology]") {
  auto check = [](const MachineTopology& m) {
    INFO(describeMachine(m) << " (" << m.source << ")");
    CHECK(m.cores >= 1);
    CHECK(m.packages >= 1);
    CHECK(m.numaNodes >= 1);
    if (m.l2Bytes > 0) CHECK((m.l2Bytes >= 64 * KiB && m.l2Bytes <= 64 * MiB));
    if (m.l3Bytes > 0) CHECK((m.l3Bytes >= m.l2Bytes && m.l3Bytes <= 2048 * MiB));
    CHECK(m.gpus >= 0);
  };
  check(discoverMachineFromSystem());
  auto hw = discoverMachineWithHwloc();
  if (hw.isOk()) {
    check(*hw);
    CHECK(localMachine().source == "hwloc");
  } else {
    WARN("hwloc: " << hw.status().toString());
  }
  check(localMachine());
  // The process's machine is what discovery finds (hwloc where it works).
  CHECK(describeMachine(localMachine()) == describeMachine(hw.isOk() ? *hw : discoverMachineFromSystem()));
}

TEST_CASE("machine description and agreement", "[unit][topology]") {
  MachineTopology m = smallMachine(2);
  m.nics = {"lo", "eth0"};
  CHECK(describeMachine(m) ==
        "1 package, 2 cores, 1 NUMA node, L2 1 MiB, L3 32 MiB, NICs: lo, eth0; GPUs: none");
  MachineTopology other = bigMachine();
  MachineTopology agreed = agreedMachine({other, m});
  CHECK(agreed.cores == 2);
  CHECK(agreed.l3Bytes == 32 * MiB);
  CHECK(agreed.gpus == 0);
  // Pooled over the bootstrap as seven integers.
  std::vector<uint8_t> bytes;
  wire::Writer w(bytes);
  writeMachineFacts(w, other);
  wire::Reader r(bytes.data(), bytes.size());
  auto decoded = readMachineFacts(r);
  REQUIRE(decoded.isOk());
  CHECK(r.atEnd());
  CHECK(decoded->packages == 2);
  CHECK(decoded->cores == 96);
  CHECK(decoded->numaNodes == 2);
  CHECK(decoded->l2Bytes == 2 * MiB);
  CHECK(decoded->l3Bytes == 105 * MiB);
  CHECK(decoded->l3Count == 2);
  CHECK(decoded->gpus == 8);
  // Cut short, or a count no machine has: refused.
  wire::Reader shortReader(bytes.data(), bytes.size() - 1);
  auto truncated = readMachineFacts(shortReader);
  REQUIRE_FALSE(truncated.isOk());
  CHECK(truncated.status().message().find("malformed machine facts") != std::string::npos);
  std::vector<uint8_t> huge = bytes;
  putLe(huge.data() + 4, 0xffffffffu, 4);  // cores
  wire::Reader hugeReader(huge.data(), huge.size());
  CHECK_FALSE(readMachineFacts(hugeReader).isOk());
}
