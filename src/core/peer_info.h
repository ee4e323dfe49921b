// PeerInfo: what a rank publishes about itself when a communicator is made.
//
// Role: the bootstrap carries it to every rank; the transport registry picks
// a transport per peer from it, and the topology groups ranks into nodes by
// it. It sits in core because both the transports and the topology (which
// the layers above use) read it. The byte form is versioned by its fields'
// order; deserialize() refuses anything malformed (it reads another
// process's bytes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace shoal {

// What a rank publishes about itself at communicator init (through the
// bootstrap) so that others can choose a transport and reach it.
struct PeerInfo {
  int rank = -1;
  std::string hostname;          // for messages
  std::string hostId;            // node identity (NCCL_HOSTID or hostname+boot id)
  uint64_t processId = 0;        // unique per process on the host (pid ^ start time)
  // The running kernel (boot id), whatever NCCL_HOSTID says: two ranks with
  // the same one exchange bytes without leaving the machine, even between
  // network namespaces (sameKernel()).
  std::string kernelId;
  // The GPU of a device communicator's rank ("GPU-<uuid>", the same in every
  // process), empty for host communicators.
  std::string gpu;
  std::vector<std::pair<std::string, std::string>> addresses;  // transport name -> address

  const std::string* address(std::string_view transport) const;
  bool sameKernel(const PeerInfo& other) const { return !kernelId.empty() && kernelId == other.kernelId; }
  // Whether two ranks run on one kernel, i.e. share CPUs: the same kernel id
  // (emulated nodes, network namespaces with their own NCCL_HOSTID, still
  // do), else the same host id.
  bool sharesCpusWith(const PeerInfo& other) const { return hostId == other.hostId || sameKernel(other); }
  // Whether two ranks are threads of one process.
  bool sameProcess(const PeerInfo& other) const { return processId == other.processId && hostId == other.hostId; }
  std::string serialize() const;
  static Result<PeerInfo> deserialize(std::string_view bytes);
};

}  // namespace shoal
