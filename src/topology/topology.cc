#include "topology/topology.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "core/params.h"

namespace shoal {

std::string localHostname() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

std::string localHostId() {
  const std::string& forced = params().hostId;
  if (!forced.empty()) return forced;
  std::string bootId;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, bootId);
  return localHostname() + ":" + bootId;
}

uint64_t localProcessId() {
  static const uint64_t id = [] {
    uint64_t nonce = 0;
    if (getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce)) nonce = static_cast<uint64_t>(time(nullptr));
    return (nonce << 22) ^ static_cast<uint64_t>(getpid());
  }();
  return id;
}

int Topology::localRank(int rank) const {
  const auto& members = nodes[nodeOfRank[rank]];
  return static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
}

int Topology::maxRanksPerNode() const {
  size_t m = 0;
  for (const auto& n : nodes) m = std::max(m, n.size());
  return static_cast<int>(m);
}

Topology buildTopology(const std::vector<PeerInfo>& peers) {
  Topology t;
  t.nranks = static_cast<int>(peers.size());
  t.nodeOfRank.resize(peers.size());
  std::map<std::string, int> nodeIndex;  // by first appearance in rank order
  for (size_t r = 0; r < peers.size(); ++r) {
    auto [it, inserted] = nodeIndex.emplace(peers[r].hostId, static_cast<int>(t.nodes.size()));
    if (inserted) t.nodes.emplace_back();
    t.nodeOfRank[r] = it->second;
    t.nodes[it->second].push_back(static_cast<int>(r));
  }
  for (const auto& node : t.nodes) t.ring.insert(t.ring.end(), node.begin(), node.end());
  return t;
}

}  // namespace shoal
