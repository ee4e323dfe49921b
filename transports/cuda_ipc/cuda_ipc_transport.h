// CudaIpcTransport: connections between processes of one host whose GPUs
// share memory (the same GPU, or two with peer access), through GPU memory
// (README.md).
//
// Role: one per process (makeCudaIpcTransport(), owned by the transport
// registry), started only in a process that uses CUDA. localAddress() opens
// a Unix socket in the abstract namespace and returns its name; the lower
// rank of a pair allocates the connection's memory and sends its descriptors
// there (SCM_RIGHTS) in a hello signed with the communicator's secret; the
// higher rank waits for that hello (connectWaitsForPeer) and maps them.
// canConnect(): both ranks are ranks of device communicators, on one kernel
// and host id, in different processes, and their GPUs share memory.
// Thread: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "transports/transport.h"

namespace shoal {

std::unique_ptr<Transport> makeCudaIpcTransport();

namespace cuda_ipc {

inline constexpr size_t kHelloBytes = 80;
// FIFOs in the lower rank's allocation: the posted messages' lane each way,
// then the stream ring's.
inline constexpr uint64_t kFifoLanes = 4;

// What the lower rank sends with the two descriptors (FIFO memory, control
// block). Little-endian on the wire; the proof covers everything before it.
struct Hello {
  uint64_t commId = 0;
  int32_t fromRank = -1;
  int32_t toRank = -1;
  uint16_t channel = 0;
  uint32_t slots = 0;
  uint64_t slotBytes = 0;
  // The FIFO allocation's size as the exporter made it (granularity-rounded;
  // a multiple of 64 KiB), which the importer maps whole.
  uint64_t allocationBytes = 0;
  // The lower rank's streams run the stream ring (stream memory operations).
  bool streamRing = false;
  uint8_t nonce[8] = {};
  uint8_t proof[32] = {};
};
void encodeHello(const Hello& hello, uint8_t out[kHelloBytes]);
Result<Hello> decodeHello(const uint8_t in[kHelloBytes]);
Status signHello(Hello& hello, std::string_view secret);
bool verifyHello(const Hello& hello, std::string_view secret);

}  // namespace cuda_ipc
}  // namespace shoal
