#include "comm/window.h"

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
      maps_(static_cast<size_t>(nranks), std::vector<bool>(static_cast<size_t>(nranks), false)) {
  buffers_[static_cast<size_t>(rank)] = static_cast<uint8_t*>(user);
  sizes_[static_cast<size_t>(rank)] = bytes;
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
  if (peer.processId == self.processId && peer.hostId == self.hostId) {
    buffers_[at] = reinterpret_cast<uint8_t*>(record.address);  // this process
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
  const cuda::PeerImports::Key key{record.pidNamespace, record.pid, record.deviceSerial};
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

}  // namespace shoal
