// ShmTransport: connections between processes of one host through shared
// memory (README.md).
//
// Role: one per process (makeShmTransport(), owned by the transport registry).
// localAddress() returns "<pid>:<boot id>:<probe address>:<probe value>": the
// peer uses the pid for the segment name and liveness, the boot id to be sure
// it is the same kernel, and reads the probe with process_vm_readv to learn
// whether single-copy transfers from this process work (detected per pair at
// connect; when they do not, large messages stream through the segment).
// canConnect(): same host id, different process, same boot id, and
// NCCL_SHM_DISABLE unset. connect() never blocks (shm_connection.h).
// Thread: every method may be called from any thread.
#pragma once

#include <memory>

#include "transports/transport.h"

namespace shoal {

std::unique_ptr<Transport> makeShmTransport();

// Whether this process may read `peer`'s memory (process_vm_readv probe
// against the value in its shm address; cached per process). False when the
// peer published no shm address or SHOAL_SHM_CMA=0.
bool canReadPeerMemory(const PeerInfo& peer);


namespace shm {

struct Address {
  int pid = 0;
  std::string bootId;
  uint64_t probeAddress = 0;
  uint64_t probeValue = 0;
};
std::string formatAddress(const Address& address);
Result<Address> parseAddress(std::string_view text);

}  // namespace shm
}  // namespace shoal
