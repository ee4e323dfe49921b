#include "core/peer_info.h"

#include <charconv>

#include "core/wire.h"

namespace shoal {
namespace {

// Each field is a length-prefixed string (numbers in decimal), the format
// every version so far has written.
constexpr uint32_t kMaxFieldBytes = 1u << 20;
constexpr long kMaxAddresses = 64;

template <typename Integer>
bool parseDecimal(const std::string& text, Integer& out) {
  const char* end = text.data() + text.size();
  auto [at, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && at == end;
}

}  // namespace

const std::string* PeerInfo::address(std::string_view transport) const {
  for (const auto& [name, addr] : addresses)
    if (name == transport) return &addr;
  return nullptr;
}

std::string PeerInfo::serialize() const {
  std::vector<uint8_t> bytes;
  wire::Writer w(bytes);
  w.str(std::to_string(rank));
  w.str(hostname);
  w.str(hostId);
  w.str(std::to_string(processId));
  w.str(std::to_string(addresses.size()));
  for (const auto& [name, addr] : addresses) {
    w.str(name);
    w.str(addr);
  }
  w.str(kernelId);  // last: a reader that does not know it stops before it
  w.str(gpu);       // after it, for the same reason
  return std::string(bytes.begin(), bytes.end());
}

Result<PeerInfo> PeerInfo::deserialize(std::string_view in) {
  PeerInfo p;
  wire::Reader r(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  const std::string rank = r.str(kMaxFieldBytes);
  p.hostname = r.str(kMaxFieldBytes);
  p.hostId = r.str(kMaxFieldBytes);
  const std::string pid = r.str(kMaxFieldBytes);
  const std::string count = r.str(kMaxFieldBytes);
  long n = -1;
  if (!r.ok() || !parseDecimal(rank, p.rank) || !parseDecimal(pid, p.processId) || !parseDecimal(count, n))
    return internalError("malformed peer info");
  if (n < 0 || n > kMaxAddresses) return internalError("malformed peer info: ", n, " addresses");
  for (long i = 0; i < n; ++i) {
    std::string name = r.str(kMaxFieldBytes);
    std::string addr = r.str(kMaxFieldBytes);
    if (!r.ok()) return internalError("malformed peer info");
    p.addresses.emplace_back(std::move(name), std::move(addr));
  }
  // Absent (a writer that did not know it): "", which is never sameKernel.
  if (!r.atEnd()) p.kernelId = r.str(kMaxFieldBytes);
  if (r.ok() && !r.atEnd()) p.gpu = r.str(kMaxFieldBytes);
  if (!r.ok()) return internalError("malformed peer info");
  return p;
}

}  // namespace shoal
