// fuzz_ofi_hello: ofi::wire::decodeHello (transports/ofi/ofi_fabric.cc), the
// 80-byte control message each side of an ofi connection receives from its
// peer at set-up (any endpoint that can reach ours may send one).
//
// The decoder is a pure function; ofi_fabric.cc is compiled with libfabric's
// headers but libfabric itself is only ever dlopen()ed by loadApi(), which
// this harness never calls: the target neither links nor loads libfabric.
//
// Input: the message as received, any length (the rail passes the received
// byte count). Properties: a decoded hello came from exactly 80 bytes,
// re-encodes to them, and names distinct non-negative ranks and a connection
// id in 1..kMaxId.
#include <cstring>

#include "fuzz_common.h"
#include "transports/ofi/ofi_fabric.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace wire = shoal::ofi::wire;
  shoal::Result<wire::Hello> hello = wire::decodeHello(data, size);
  if (!hello.isOk()) return 0;
  const wire::Hello& h = hello.value();
  FUZZ_CHECK(size == wire::kHelloBytes, "a hello of %zu bytes decoded", size);
  FUZZ_CHECK(h.fromRank >= 0 && h.toRank >= 0 && h.fromRank != h.toRank, "ranks %d -> %d accepted", h.fromRank,
             h.toRank);
  FUZZ_CHECK(h.recvId >= 1 && h.recvId <= wire::kMaxId, "connection id %u accepted", h.recvId);
  uint8_t out[wire::kHelloBytes];
  wire::encodeHello(h, out);
  FUZZ_CHECK(std::memcmp(data, out, sizeof(out)) == 0, "re-encoding changed the hello");
  FUZZ_CHECK(!(wire::verifyHello(h, "fuzz secret") && wire::verifyHello(h, "another secret")),
             "one proof verified under two secrets");
  return 0;
}
