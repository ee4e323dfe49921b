#include <cstring>

#include "core/peer_info.h"

namespace shoal {
namespace {

void putString(std::string& out, std::string_view s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof(n));
  out.append(s);
}

bool getString(std::string_view& in, std::string& out) {
  uint32_t n;
  if (in.size() < sizeof(n)) return false;
  std::memcpy(&n, in.data(), sizeof(n));
  in.remove_prefix(sizeof(n));
  if (n > in.size() || n > (1u << 20)) return false;
  out.assign(in.substr(0, n));
  in.remove_prefix(n);
  return true;
}

}  // namespace

const std::string* PeerInfo::address(std::string_view transport) const {
  for (const auto& [name, addr] : addresses)
    if (name == transport) return &addr;
  return nullptr;
}

std::string PeerInfo::serialize() const {
  std::string out;
  putString(out, std::to_string(rank));
  putString(out, hostname);
  putString(out, hostId);
  putString(out, std::to_string(processId));
  putString(out, std::to_string(addresses.size()));
  for (const auto& [name, addr] : addresses) {
    putString(out, name);
    putString(out, addr);
  }
  putString(out, kernelId);  // last: a reader that does not know it stops before it
  putString(out, gpu);       // after it, for the same reason
  return out;
}

Result<PeerInfo> PeerInfo::deserialize(std::string_view in) {
  PeerInfo p;
  std::string rank, pid, count;
  if (!getString(in, rank) || !getString(in, p.hostname) || !getString(in, p.hostId) ||
      !getString(in, pid) || !getString(in, count))
    return internalError("malformed peer info");
  p.rank = std::atoi(rank.c_str());
  p.processId = std::strtoull(pid.c_str(), nullptr, 10);
  long n = std::atol(count.c_str());
  if (n < 0 || n > 64) return internalError("malformed peer info: ", n, " addresses");
  for (long i = 0; i < n; ++i) {
    std::string name, addr;
    if (!getString(in, name) || !getString(in, addr)) return internalError("malformed peer info");
    p.addresses.emplace_back(std::move(name), std::move(addr));
  }
  // Absent (a writer that did not know it): "", which is never sameKernel.
  if (!in.empty() && !getString(in, p.kernelId)) return internalError("malformed peer info");
  if (!in.empty() && !getString(in, p.gpu)) return internalError("malformed peer info");
  return p;
}

}  // namespace shoal
