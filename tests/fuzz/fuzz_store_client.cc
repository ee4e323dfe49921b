// fuzz_store_client: the client side of the TCP store protocol
// (src/bootstrap/store_protocol.h), i.e. every byte a rank reads from what it
// believes is its bootstrap root: the 56-byte challenge and 4-byte accept of
// the handshake, then reply frames {u32 length, u64 id, u8 status, body}
// to SET, GET, ERASE and CHECK.
//
// The parser lives in tcp_store.cc's anonymous namespace (TcpStore and
// clientHandshake); this harness compiles tcp_store.cc into its own
// translation unit (the #include below) to reach them. The store's socket is
// one end of a socketpair; the harness writes the input there as the root's
// bytes, closes that direction, and makes one call. EOF ends every wait, so
// no input waits for a deadline.
//
// Input: u8 op (% 5: 0 set, 1 get, 2 erase, 3 check, 4 handshake),
//        u8 keys (% 5: how many keys the call names), then the root's bytes.
#include "bootstrap/tcp_store.cc"  // NOLINT: see above

#include "fuzz_common.h"

namespace {

using namespace shoal;
using shoal_fuzz::Input;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  int op = in.u8() % 5;
  int keyCount = in.u8() % 5;
  std::string_view rootBytes = in.rest();

  shoal_fuzz::SocketPair pair = shoal_fuzz::SocketPair::make();
  shoal_fuzz::writeSome(pair.b, rootBytes.data(), rootBytes.size());
  ::shutdown(pair.b, SHUT_WR);

  std::vector<std::string> keys;
  for (int i = 0; i < keyCount; ++i) keys.push_back("key" + std::to_string(i));
  Deadline deadline = Deadline::afterMs(10'000);

  if (op == 4) {
    UniqueIdContents id;
    id.magic = 0x0123456789abcdefull;
    for (int i = 0; i < 32; ++i) id.secret[i] = static_cast<uint8_t>(i);
    id.address = "127.0.0.1:1";
    Status s = clientHandshake(pair.a, id, "fuzz root", deadline);
    // The root's MAC covers our random nonce: no input can prove it.
    FUZZ_CHECK(!s.isOk(), "a handshake succeeded without the root's proof");
    ::close(pair.a);
  } else {
    TcpStore store(net::Fd(pair.a), "fuzz root");
    switch (op) {
      case 0: (void)store.set("key0", "value", deadline); break;
      case 1: {
        Result<std::vector<std::string>> got = store.get(keys, deadline);
        if (got.isOk()) FUZZ_CHECK(got.value().size() == keys.size(), "get returned %zu values for %zu keys",
                                   got.value().size(), keys.size());
        break;
      }
      case 2: (void)store.erase(keys, deadline); break;
      case 3: {
        Result<std::vector<bool>> got = store.check(keys, deadline);
        if (got.isOk()) FUZZ_CHECK(got.value().size() == keys.size(), "check returned %zu answers for %zu keys",
                                   got.value().size(), keys.size());
        break;
      }
    }
    (void)store.describe();
  }
  ::close(pair.b);
  return 0;
}
