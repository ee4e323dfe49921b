#include "comm/window.h"

#include <algorithm>

#include "core/log.h"
#include "core/process.h"
#include "cuda/peer_imports.h"
#include "memory/shared_memory.h"

namespace shoal {

Window::Window(void* user, size_t bytes, int flags, int rank, int nranks)
    : user_(user),
      bytes_(bytes),
      flags_(flags),
      rank_(rank),
      buffers_(static_cast<size_t>(nranks), nullptr),
      sizes_(static_cast<size_t>(nranks), 0),
      addresses_(static_cast<size_t>(nranks), 0),
      device_(static_cast<size_t>(nranks), false),
      maps_(static_cast<size_t>(nranks), std::vector<bool>(static_cast<size_t>(nranks), false)) {
  buffers_[static_cast<size_t>(rank)] = static_cast<uint8_t*>(user);
  sizes_[static_cast<size_t>(rank)] = bytes;
  addresses_[static_cast<size_t>(rank)] = reinterpret_cast<uint64_t>(user);
}

bool Window::deviceEverywhere() const {
  return std::all_of(device_.begin(), device_.end(), [](bool d) { return d; });
}

bool Window::mappedEverywhere() const {
  for (const auto& row : maps_)
    for (bool m : row)
      if (!m) return false;
  return true;
}

Result<WindowRecord> Window::describe(cuda::Driver* driver, void* buff, size_t bytes, net::Fd& exported) {
  WindowRecord record;
  record.address = reinterpret_cast<uint64_t>(buff);
  record.bytes = bytes;
  record.pid = currentPid();
  record.pidNamespace = pidNamespaceId();
  if (driver) {
    SHOAL_ASSIGN_OR_RETURN(cuda::MemoryKind kind, driver->memoryKind(buff));
    if (kind == cuda::MemoryKind::kDevice) {
      record.deviceMemory = true;
      // Only a Shoal allocation (ncclMemAlloc) exports; other device memory
      // (cudaMalloc) is registered, not mapped by other processes.
      std::optional<cuda::Driver::DeviceAllocation> allocation = driver->deviceAllocationOf(buff, bytes);
      if (!allocation) return record;
      SHOAL_ASSIGN_OR_RETURN(cuda::Driver::Exported e, driver->exportDeviceMemory(allocation->base),
                             "exporting the window's allocation");
      exported.reset(e.fd);
      SHOAL_ASSIGN_OR_RETURN(FileIdentity file, fileIdentity(e.fd), "the window's exported allocation");
      record.deviceSerial = allocation->serial;
      record.deviceBytes = e.bytes;
      record.deviceOffset = static_cast<uint64_t>(static_cast<uint8_t*>(buff) - allocation->base);
      record.deviceFd = e.fd;
      record.fileDevice = file.device;
      record.fileInode = file.inode;
      return record;
    }
  }
  if (std::optional<memory::SharedLocation> where = memory::findShared(buff, bytes)) {
    record.sharedSequence = where->sequence;
    record.sharedOffset = where->offset;
  }
  return record;
}

void Window::map(int r, const WindowRecord& record, const PeerInfo& self, const PeerInfo& peer,
                 cuda::Driver* driver) {
  const auto at = static_cast<size_t>(r);
  sizes_[at] = record.bytes;
  addresses_[at] = record.address;
  device_[at] = record.deviceMemory;
  if (peer.processId == self.processId && peer.hostId == self.hostId) {
    // This process: its address, unless it is device memory of another GPU,
    // which this rank's kernels have not been given access to.
    if (!record.deviceMemory || peer.gpu == self.gpu) buffers_[at] = reinterpret_cast<uint8_t*>(record.address);
    return;
  }
  // Another process: its pid names it here only on one kernel, in one pid
  // namespace.
  if (!self.sameKernel(peer) || record.pidNamespace == 0 || record.pidNamespace != pidNamespaceId()) return;
  if (record.sharedSequence != 0) {
    if (const uint8_t* base = memory::mapPeerAllocation(record.pid, record.sharedSequence))
      buffers_[at] = const_cast<uint8_t*>(base) + record.sharedOffset;
    return;
  }
  if (record.deviceSerial == 0 || driver == nullptr || self.gpu.empty() ||
      !driver->gpusShareMemory(self.gpu, peer.gpu))
    return;
  const cuda::PeerImports::Key key{peer.processId, record.deviceSerial, self.gpu};
  Result<uint8_t*> base = cuda::PeerImports::instance().acquire(*driver, key, record.deviceBytes, [&] {
    return copyDescriptorOf(record.pid, record.deviceFd, FileIdentity{record.fileDevice, record.fileInode});
  });
  if (!base.isOk()) {
    SHOAL_INFO(subsys::kReg, "window ", user_, ": rank ", r, "'s buffer is not mapped here (", base.status().message(),
               ")");
    return;
  }
  imported_.push_back(base.value());
  buffers_[at] = base.value() + record.deviceOffset;
}

WindowOutcome Window::outcome(std::string error) const {
  WindowOutcome out;
  out.error = std::move(error);
  for (size_t r = 0; r < buffers_.size(); ++r) out.maps.push_back(buffers_[r] != nullptr);
  return out;
}

Status Window::learnOutcomes(const std::vector<WindowOutcome>& outcomes) {
  if (outcomes.size() != maps_.size()) return internalError("window outcomes of ", outcomes.size(), " ranks");
  for (size_t a = 0; a < outcomes.size(); ++a) {
    if (!outcomes[a].error.empty()) return Status(Code::kInvalidUsage, str("rank ", a, ": ", outcomes[a].error));
    if (outcomes[a].maps.size() != maps_.size())
      return internalError("rank ", a, "'s window outcome names ", outcomes[a].maps.size(), " ranks");
    maps_[a] = outcomes[a].maps;
  }
  return Status::ok();
}

void Window::release(cuda::Driver* driver) {
  if (driver)
    for (uint8_t* base : imported_) cuda::PeerImports::instance().release(*driver, base);
  imported_.clear();
  for (size_t r = 0; r < buffers_.size(); ++r)
    if (static_cast<int>(r) != rank_) buffers_[r] = nullptr;
}

void Windows::add(std::unique_ptr<Window> window) {
  std::lock_guard<std::mutex> lock(mutex_);
  windows_.push_back(std::move(window));
  count_.store(windows_.size(), std::memory_order_release);
}

bool Windows::retire(const void* handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(windows_.begin(), windows_.end(), [&](const auto& w) { return w.get() == handle; });
  if (it == windows_.end()) return false;
  retired_.push_back(std::move(*it));
  windows_.erase(it);
  count_.store(windows_.size(), std::memory_order_release);
  return true;
}

std::vector<std::unique_ptr<Window>> Windows::takeRetired() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::unique_ptr<Window>> retired = std::move(retired_);
  retired_.clear();
  return retired;
}

std::vector<std::unique_ptr<Window>> Windows::takeAll() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::unique_ptr<Window>> all = std::move(windows_);
  windows_.clear();
  for (auto& w : retired_) all.push_back(std::move(w));
  retired_.clear();
  count_.store(0, std::memory_order_release);
  return all;
}

Window* Windows::find(const void* handle) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& w : windows_)
    if (w.get() == handle) return w.get();
  return nullptr;
}

namespace {
// Whether [address, address + bytes) lies inside [base, base + size).
bool inside(uint64_t address, uint64_t bytes, uint64_t base, uint64_t size) {
  return address >= base && address - base <= size && bytes <= size - (address - base);
}
}  // namespace

bool Windows::holdsEverywhere(const void* p, uint64_t bytes) const {
  const auto address = reinterpret_cast<uint64_t>(p);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& w : windows_)
    if (inside(address, bytes, reinterpret_cast<uint64_t>(w->userPtr()), w->bytes()) && w->mappedEverywhere() &&
        w->deviceEverywhere())
      return true;
  return false;
}

uint8_t* Windows::find(int peer, uint64_t address, uint64_t bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto* list : {&windows_, &retired_})
    for (const auto& w : *list)
      if (w->buffer(peer) != nullptr && inside(address, bytes, w->addressOf(peer), w->bytesOf(peer)))
        return w->buffer(peer) + (address - w->addressOf(peer));
  return nullptr;
}

}  // namespace shoal
