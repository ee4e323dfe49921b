// fuzz_tcp_hello: tcp::decodeHello (transports/tcp/tcp_transport.cc), the
// first 80 bytes on every socket accepted by the tcp transport's listener,
// which anyone who can reach the port may send.
//
// Input: the hello's bytes (zero-padded or cut to 80). Properties: a decoded
// hello re-encodes to the same 80 bytes and respects the limits the acceptor
// relies on (socketIndex < sockets <= 64, distinct non-negative ranks);
// verifyHello never accepts a proof made with another secret than the one it
// is checked with.
#include <cstring>

#include "fuzz_common.h"
#include "transports/tcp/tcp_connection.h"
#include "transports/tcp/tcp_transport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t in[shoal::tcp::kHelloBytes] = {};
  std::memcpy(in, data, size < sizeof(in) ? size : sizeof(in));
  shoal::Result<shoal::tcp::Hello> hello = shoal::tcp::decodeHello(in);
  if (!hello.isOk()) return 0;
  const shoal::tcp::Hello& h = hello.value();
  FUZZ_CHECK(h.sockets >= 1 && h.sockets <= shoal::tcp::kMaxLanes && h.socketIndex < h.sockets,
             "socket %u of %u accepted", h.socketIndex, h.sockets);
  FUZZ_CHECK(h.fromRank >= 0 && h.toRank >= 0 && h.fromRank != h.toRank, "ranks %d -> %d accepted", h.fromRank,
             h.toRank);
  uint8_t out[shoal::tcp::kHelloBytes];
  shoal::tcp::encodeHello(h, out);
  FUZZ_CHECK(std::memcmp(in, out, sizeof(in)) == 0, "re-encoding changed the hello");
  // The seeds are signed with "fuzz secret": a proof never holds for two secrets.
  FUZZ_CHECK(!(shoal::tcp::verifyHello(h, "fuzz secret") && shoal::tcp::verifyHello(h, "another secret")),
             "one proof verified under two secrets");
  return 0;
}
