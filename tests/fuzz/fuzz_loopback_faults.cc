// fuzz_loopback_faults: SHOAL_LOOPBACK_FAULTS, the loopback transport's fault
// plan "delay_us=N,reorder_seed=S,fail_nth=N,blackhole_nth=N"
// (LoopbackFaults::parse in transports/loopback/loopback_transport.cc), read
// from the environment by every process that uses the loopback transport.
//
// A parsed plan is then put to work on a loopback pair (the code that reads
// its numbers): a few messages are posted and polled. Input: the text, then
// optionally a '\n' and one byte b: 1 + b % 4 messages (default 2).
//
// Properties: a plan either parses or is refused with a message; a
// connection under any plan fails, completes, or waits, without crashing.
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "transports/loopback/loopback_transport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  int messages = 2;
  if (size_t nl = text.find('\n'); nl != std::string::npos) {
    if (nl + 1 < text.size()) messages = 1 + static_cast<uint8_t>(text[nl + 1]) % 4;
    text.resize(nl);
  }
  shoal::Result<shoal::LoopbackFaults> faults = shoal::LoopbackFaults::parse(text);
  if (!faults.isOk()) {
    FUZZ_CHECK(!faults.status().message().empty(), "a refusal without a message");
    return 0;
  }
  auto [a, b] = shoal::makeLoopbackPair("rank 0", "rank 1", faults.value());
  std::vector<uint64_t> sendBuf(static_cast<size_t>(messages), 7), recvBuf(static_cast<size_t>(messages), 0);
  for (int i = 0; i < messages; ++i) {
    if (!a->postSend(&sendBuf[i], sizeof(uint64_t), 100 + i, i).isOk()) break;
    if (!b->postRecv(&recvBuf[i], sizeof(uint64_t), 100 + i, i).isOk()) break;
  }
  std::vector<shoal::Completion> done;
  for (int round = 0; round < 8; ++round) {
    bool progressed = false;
    if (!a->poll(done, progressed).isOk()) break;
    if (!b->poll(done, progressed).isOk()) break;
  }
  for (const shoal::Completion& c : done) FUZZ_CHECK(c.bytes == sizeof(uint64_t), "completion of %llu bytes",
                                                     (unsigned long long)c.bytes);
  return 0;
}
