// Topology: where each rank of a communicator lives, and what this machine is.
//
// Role: a plain value built at communicator init from every rank's PeerInfo:
// host identity per rank, the node (host) groups, the subgroups hierarchical
// algorithms compose over (node, node leaders, rails), the ring order (ranks of
// one node adjacent, so a ring crosses each node boundary once), and the
// summary the tuner decides from. Pure functions; no I/O except
// localHostId()/localHostname() and machine discovery (machine.h).
//
// Vocabulary:
//   node        the ranks of one host (same host identity), in rank order.
//   local rank  a rank's index within its node.
//   leader      local rank 0 of a node; leaders lists one per node, in node order.
//   rail r      local rank r of every node that has one, in node order. With
//               uneven nodes a rail skips the nodes that have fewer than r+1
//               ranks, so rails[0] == leaders and later rails may be shorter.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/peer_info.h"
#include "core/types.h"
#include "topology/machine.h"

namespace shoal {

// NCCL_HOSTID if set, else hostname + ":" + /proc/sys/kernel/random/boot_id.
std::string localHostId();
std::string localHostname();
// Unique per process for the life of the machine (pid and a random nonce).
uint64_t localProcessId();

struct Topology {
  int nranks = 0;
  std::vector<int> nodeOfRank;              // node index per rank
  std::vector<int> localRankOfRank;         // index of each rank within its node
  std::vector<std::vector<int>> nodes;      // ranks of each node, ascending
  std::vector<int> leaders;                 // local rank 0 of every node, node order
  std::vector<std::vector<int>> rails;      // rails[r]: local rank r of every node having it
  std::vector<int> ring;                    // ring order: node by node
  int localRank(int rank) const { return localRankOfRank[rank]; }
  bool sameNode(int a, int b) const { return nodeOfRank[a] == nodeOfRank[b]; }
  const std::vector<int>& nodeOf(int rank) const { return nodes[nodeOfRank[rank]]; }
  const std::vector<int>& railOf(int rank) const { return rails[localRankOfRank[rank]]; }
  int maxRanksPerNode() const;
  int minRanksPerNode() const;
};

// Nodes are numbered by first appearance in rank order.
Topology buildTopology(const std::vector<PeerInfo>& peers);

const char* linkClassName(LinkClass c);  // "loopback", "shm", "net"
std::optional<LinkClass> parseLinkClass(std::string_view name);
inline LinkClass slower(LinkClass a, LinkClass b) { return a > b ? a : b; }

// What the tuner decides from. Every field must be the same on every rank of a
// communicator (each rank's tuner must reach the same decision), so it is
// computed from global facts only.
struct TopologySummary {
  int nranks = 1;
  int nnodes = 1;
  bool singleProcess = false;  // every rank in this process (loopback)
  // 0 = unknown: taken as ceil(nranks / nnodes) and floor(nranks / nnodes).
  int maxRanksPerNode = 0;
  int minRanksPerNode = 0;
  // Slowest class between two ranks of one node, and between two nodes.
  // Unset: loopback when singleProcess, else shm inside and net across.
  std::optional<LinkClass> intraNode;
  std::optional<LinkClass> interNode;
  // The transport between node 0's leader and node 1's as node 0's leader
  // chose it ("tcp", "ofi"; empty on one node or when unknown), the same on
  // every rank, and whether its CPU moves the bytes through kernel sockets
  // (Transport::cpuCopiesBytes: tcp, ofi over tcp;ofi_rxm). The tuner's model
  // counts cache-resident bytes as faster only then (docs/decisions/0006, 0007).
  // netTransport names it for messages only; the model reads the flags:
  // netEmulatedOverSockets when its messages pass a messaging layer emulated
  // over kernel sockets (Transport::emulatesMessagesOverSockets).
  std::string netTransport;
  bool netCpuCopies = false;
  bool netEmulatedOverSockets = false;
  // The machine the ranks run on. Unset: this process's localMachine().
  std::optional<MachineTopology> machine;
};

// The class of the link between ranks a and b (the communicator asks the
// transport registry; tests pass a rule).
using LinkClassifier = std::function<LinkClass(int a, int b)>;

// Fills every field of the summary from the topology. Rank-independent: it
// classifies fixed pairs only (the first two ranks of each node; the leader of
// node 0 with every other leader), O(nodes) calls. machine is passed in by
// the caller (it should be the same on every rank, e.g. agreedMachine()).
TopologySummary summarizeTopology(const Topology& topo, const LinkClassifier& classify,
                                  bool singleProcess,
                                  std::optional<MachineTopology> machine = std::nullopt);

}  // namespace shoal
