// fuzz_cuda_ipc_hello: cuda_ipc::decodeHello (transports/cuda_ipc/
// cuda_ipc_transport.cc), the 80 bytes that arrive with two descriptors on
// the cuda_ipc transport's Unix socket, which any process of the host's
// network namespace may connect to.
//
// Input: the hello's bytes (zero-padded or cut to 80). Properties: a decoded
// hello re-encodes to the same 80 bytes and respects the limits the acceptor
// relies on (1..64 slots of 8 KiB..128 MiB, an allocation that holds four
// lanes of them, distinct non-negative ranks);
// verifyHello never accepts a proof made with another secret than the one it
// is checked with.
#include <cstring>

#include "fuzz_common.h"
#include "transports/cuda_ipc/cuda_ipc_connection.h"
#include "transports/cuda_ipc/cuda_ipc_transport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t in[shoal::cuda_ipc::kHelloBytes] = {};
  std::memcpy(in, data, size < sizeof(in) ? size : sizeof(in));
  shoal::Result<shoal::cuda_ipc::Hello> hello = shoal::cuda_ipc::decodeHello(in);
  if (!hello.isOk()) return 0;
  const shoal::cuda_ipc::Hello& h = hello.value();
  FUZZ_CHECK(h.slots >= 1 && h.slots <= shoal::cuda_ipc::kMaxSlots, "%u slots accepted", h.slots);
  FUZZ_CHECK(h.slotBytes >= (8u << 10) && h.slotBytes <= (128ull << 20), "slots of %llu bytes accepted",
             static_cast<unsigned long long>(h.slotBytes));
  FUZZ_CHECK(h.allocationBytes >= shoal::cuda_ipc::kFifoLanes * h.slots * h.slotBytes, "an allocation of %llu bytes accepted for %u slots",
             static_cast<unsigned long long>(h.allocationBytes), h.slots);
  FUZZ_CHECK(h.fromRank >= 0 && h.toRank >= 0 && h.fromRank != h.toRank, "ranks %d -> %d accepted", h.fromRank,
             h.toRank);
  uint8_t out[shoal::cuda_ipc::kHelloBytes];
  shoal::cuda_ipc::encodeHello(h, out);
  FUZZ_CHECK(std::memcmp(in, out, sizeof(in)) == 0, "re-encoding changed the hello");
  // The seeds are signed with "fuzz secret": a proof never holds for two secrets.
  FUZZ_CHECK(!(shoal::cuda_ipc::verifyHello(h, "fuzz secret") && shoal::cuda_ipc::verifyHello(h, "another secret")),
             "one proof verified under two secrets");
  return 0;
}
