#include "topology/topology.h"

#include <pthread.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <map>

#include "core/params.h"
#include "core/process.h"

namespace shoal {

std::string localHostname() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

std::string localHostId() {
  const std::string& forced = params().hostId;
  if (!forced.empty()) return forced;
  return localHostname() + ":" + localKernelId();
}

namespace {

// Random per process, so that a pid reused (a process that exited, another
// pid namespace) does not give the same id.
std::atomic<uint64_t> gProcessNonce{0};

void renewProcessNonce() {
  uint64_t nonce = 0;
  if (getrandom(&nonce, sizeof(nonce), GRND_NONBLOCK) != sizeof(nonce)) nonce = static_cast<uint64_t>(time(nullptr));
  gProcessNonce.store(nonce, std::memory_order_relaxed);
}

}  // namespace

uint64_t localProcessId() {
  // A forked child is another process: its nonce is renewed in the fork's
  // child handler (one thread there), and its pid differs anyway.
  static const bool once = [] {
    renewProcessNonce();
    return pthread_atfork(nullptr, nullptr, renewProcessNonce) == 0;
  }();
  (void)once;
  return (gProcessNonce.load(std::memory_order_relaxed) << 22) ^ static_cast<uint64_t>(getpid());
}

int Topology::maxRanksPerNode() const {
  size_t m = 0;
  for (const auto& n : nodes) m = std::max(m, n.size());
  return static_cast<int>(m);
}

int Topology::minRanksPerNode() const {
  if (nodes.empty()) return 0;
  size_t m = nodes.front().size();
  for (const auto& n : nodes) m = std::min(m, n.size());
  return static_cast<int>(m);
}

Topology buildTopology(const std::vector<PeerInfo>& peers) {
  Topology t;
  t.nranks = static_cast<int>(peers.size());
  t.nodeOfRank.resize(peers.size());
  t.localRankOfRank.resize(peers.size());
  std::map<std::string, int> nodeIndex;  // by first appearance in rank order
  for (size_t r = 0; r < peers.size(); ++r) {
    auto [it, inserted] = nodeIndex.emplace(peers[r].hostId, static_cast<int>(t.nodes.size()));
    if (inserted) t.nodes.emplace_back();
    std::vector<int>& node = t.nodes[it->second];
    t.nodeOfRank[r] = it->second;
    t.localRankOfRank[r] = static_cast<int>(node.size());
    node.push_back(static_cast<int>(r));
  }
  t.rails.resize(static_cast<size_t>(t.maxRanksPerNode()));
  for (const auto& node : t.nodes) {
    t.leaders.push_back(node.front());
    for (size_t local = 0; local < node.size(); ++local) t.rails[local].push_back(node[local]);
    t.ring.insert(t.ring.end(), node.begin(), node.end());
  }
  return t;
}

const char* linkClassName(LinkClass c) {
  switch (c) {
    case LinkClass::kLoopback: return "loopback";
    case LinkClass::kShm: return "shm";
    case LinkClass::kNet: return "net";
  }
  return "?";
}

std::optional<LinkClass> parseLinkClass(std::string_view name) {
  for (LinkClass c : {LinkClass::kLoopback, LinkClass::kShm, LinkClass::kNet})
    if (name == linkClassName(c)) return c;
  return std::nullopt;
}

TopologySummary summarizeTopology(const Topology& topo, const LinkClassifier& classify,
                                  bool singleProcess, std::optional<MachineTopology> machine) {
  TopologySummary s;
  s.nranks = topo.nranks;
  s.nnodes = static_cast<int>(topo.nodes.size());
  s.singleProcess = singleProcess;
  s.maxRanksPerNode = topo.maxRanksPerNode();
  s.minRanksPerNode = topo.minRanksPerNode();
  for (const auto& node : topo.nodes) {
    if (node.size() < 2) continue;
    LinkClass c = classify(node[0], node[1]);
    s.intraNode = s.intraNode ? slower(*s.intraNode, c) : c;
  }
  for (size_t n = 1; n < topo.leaders.size(); ++n) {
    LinkClass c = classify(topo.leaders[0], topo.leaders[n]);
    s.interNode = s.interNode ? slower(*s.interNode, c) : c;
  }
  s.machine = std::move(machine);
  return s;
}

}  // namespace shoal
