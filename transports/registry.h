// Transport registry: the process-wide transports and the choice per peer.
//
// Role: owns one Transport of each kind for the life of the process and picks,
// for each peer, the first viable one in priority order (docs/design.md, Transports):
//   same process -> loopback; same host -> shm; otherwise -> ofi with a
//   hardware provider, else tcp.
// A device-direct communicator (TransportChoice) first tries the transports
// whose connections move device memory (cuda_ipc between processes whose
// GPUs share memory).
// SHOAL_TRANSPORT forces a kind for every peer; NCCL_NET (else the
// communicator's ncclConfig_t.netName) =Socket forces tcp and =Libfabric (or
// OFI) forces ofi for peers on other hosts. A forced kind that cannot reach a
// peer is an error, never a silent fallback. Thread-safe.
#pragma once

#include <string>
#include <vector>

#include "transports/transport.h"

namespace shoal {

// All transports, in priority order.
const std::vector<Transport*>& allTransports();
Transport* findTransport(std::string_view name);
// The transport a rank uses for its own messages (in-process, whatever is forced).
Transport* transportToSelf();
// [base, base + bytes) keeps its pages until forgetMemory names it
// (memory/known_ranges.h): transports may keep registrations of it. Called
// for ncclMemAlloc and ncclCommRegister buffers and Shoal's own staging and
// scratch; every other buffer's registrations last one operation. Thread-safe.
void rememberMemory(const void* base, size_t bytes);
// Tells every transport that [base, base + bytes) is being freed or
// deregistered (Transport::forgetMemory), and ends what rememberMemory said
// of that range. Thread-safe.
void forgetMemory(void* base, size_t bytes);
// Tells every transport that a communicator's rank in this process is gone
// (Transport::forgetRank). Thread-safe.
void forgetRank(uint64_t commId, int rank);

// How a communicator prefers transports: agreed by all its ranks at init
// (comm/init_agreement.h), so both ends of every pair choose alike.
struct TransportChoice {
  // Every rank reaches every peer through a transport that moves device
  // memory (Transport::movesDeviceMemory): such transports come first, so
  // device buffers go GPU to GPU instead of through pinned host memory.
  bool deviceDirect = false;
  // The network for peers on other hosts, as NCCL names it ("Socket",
  // "Libfabric" or "OFI"): ncclConfig_t.netName, which NCCL_NET overrides.
  // Empty: NCCL_NET, else the default.
  std::string net;
};

// The transport for peers on other hosts that NCCL_NET, else choice.net,
// names (Socket is tcp, Libfabric and OFI are ofi), or "" where neither names
// one or SHOAL_TRANSPORT forces every peer's; any other name is
// kInvalidArgument naming where it came from.
Result<std::string> networkTransport(const TransportChoice& choice);

// Fills self.addresses with the local address of every transport wanted in
// this process (Transport::wantedInThisProcess) or named by the choice's
// network (networkTransport); transports that fail to start are skipped and
// logged, the error kept for selection.
Status publishAddresses(PeerInfo& self, const TransportChoice& choice);

// Whether the peer's process is there, asked of each transport the peer
// published an address for, in priority order, until one can tell
// (Transport::probePeerProcess): for peers whose own connections do not
// notice an exit (Transport::noticesPeerExit). Bounded by the deadline.
Transport::ProcessProbe probePeerProcess(const PeerInfo& self, const PeerInfo& peer, Deadline deadline);
// Every transport's housekeeping (Transport::tidy), from the idle check: at
// most once per kTidyEveryMs in the process, however many communicators ask.
inline constexpr int64_t kTidyEveryMs = 500;
void tidyTransports();

// The transport for connecting self to peer, honouring the overrides.
Result<Transport*> selectTransport(const PeerInfo& self, const PeerInfo& peer, TransportChoice choice);

}  // namespace shoal
