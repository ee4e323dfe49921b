// Topology: where each rank of a communicator lives.
//
// Role: a plain value built at communicator init from every rank's PeerInfo:
// host identity per rank, the node (host) groups, and the ring order the
// algorithms use (ranks of one node adjacent, so a ring crosses each node
// boundary once). Pure functions; no I/O except localHostId()/localHostname().
#pragma once

#include <string>
#include <vector>

#include "transports/transport.h"

namespace shoal {

// NCCL_HOSTID if set, else hostname + ":" + /proc/sys/kernel/random/boot_id.
std::string localHostId();
std::string localHostname();
// Unique per process for the life of the machine (pid and a random nonce).
uint64_t localProcessId();

struct Topology {
  int nranks = 0;
  std::vector<int> nodeOfRank;              // node index per rank
  std::vector<std::vector<int>> nodes;      // ranks of each node, ascending
  std::vector<int> ring;                    // ring order: node by node
  int localRank(int rank) const;            // index of rank within its node
  bool sameNode(int a, int b) const { return nodeOfRank[a] == nodeOfRank[b]; }
  int maxRanksPerNode() const;
};

Topology buildTopology(const std::vector<PeerInfo>& peers);

}  // namespace shoal
