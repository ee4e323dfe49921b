// fuzz_peer_info: PeerInfo::deserialize (src/core/peer_info.cc), the record
// {rank, hostname, host id, process id, addresses, kernel id, gpu} every rank
// publishes at communicator init and every other rank reads back from the
// bootstrap store (written there by the other process).
//
// Properties: a decoded record has at most 64 addresses, and serialize()
// gives bytes that decode to the same record.
#include <string_view>

#include "fuzz_common.h"
#include "transports/transport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  shoal::Result<shoal::PeerInfo> info = shoal::PeerInfo::deserialize(bytes);
  if (!info.isOk()) return 0;
  const shoal::PeerInfo& p = info.value();
  FUZZ_CHECK(p.addresses.size() <= 64, "%zu addresses accepted", p.addresses.size());
  for (const auto& [name, address] : p.addresses) (void)p.address(name);
  std::string again = p.serialize();
  shoal::Result<shoal::PeerInfo> back = shoal::PeerInfo::deserialize(again);
  FUZZ_CHECK(back.isOk(), "a serialized PeerInfo does not decode: %s", back.status().message().c_str());
  const shoal::PeerInfo& q = back.value();
  FUZZ_CHECK(q.rank == p.rank && q.hostname == p.hostname && q.hostId == p.hostId && q.processId == p.processId &&
                 q.kernelId == p.kernelId && q.gpu == p.gpu && q.addresses == p.addresses,
             "deserialize(serialize(info)) differs from info");
  return 0;
}
