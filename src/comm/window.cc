#include "comm/window.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/byte_order.h"
#include "core/log.h"
#include "core/process.h"
#include "core/ranges.h"
#include "cuda/peer_imports.h"
#include "memory/shared_memory.h"
#include "net/crypto.h"
#include "net/unix_socket.h"

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
  record.netNamespace = netNamespaceId();
  record.uid = static_cast<uint32_t>(::getuid());
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
      record.deviceSerial = allocation->serial;
      record.deviceBytes = e.bytes;
      record.deviceOffset = static_cast<uint64_t>(static_cast<uint8_t*>(buff) - allocation->base);
      return record;
    }
  }
  if (std::optional<memory::SharedLocation> where = memory::findShared(buff, bytes)) {
    record.sharedSequence = where->sequence;
    record.sharedOffset = where->offset;
  }
  return record;
}

bool Window::sendsTo(const WindowRecord& mine, const WindowRecord& theirs, const PeerInfo& self,
                     const PeerInfo& peer, cuda::Driver* driver) {
  return mine.deviceSerial != 0 && !theirs.mailbox.empty() && peer.processId != self.processId &&
         self.sameKernel(peer) && theirs.netNamespace != 0 && theirs.netNamespace == mine.netNamespace &&
         theirs.uid == mine.uid && driver != nullptr && !self.gpu.empty() &&
         driver->gpusShareMemory(self.gpu, peer.gpu);
}

void Window::map(int r, const WindowRecord& record, const PeerInfo& self, const PeerInfo& peer, cuda::Driver* driver,
                 bool runsKernels, net::Fd descriptor) {
  const auto at = static_cast<size_t>(r);
  sizes_[at] = record.bytes;
  addresses_[at] = record.address;
  device_[at] = record.deviceMemory;
  if (record.deviceMemory && !runsKernels && peer.rank != self.rank) return;
  if (peer.sameProcess(self)) {
    // This process: its address, unless it is device memory of another GPU
    // that this rank's GPU was not granted (ncclMemAlloc grants every GPU
    // with peer access; other device memory is not granted), or this rank
    // had no GPU at init (nothing is known of where its calls run).
    void* address = reinterpret_cast<void*>(record.address);
    if (!record.deviceMemory || (!self.gpu.empty() && peer.gpu == self.gpu) ||
        (driver != nullptr && record.deviceSerial != 0 && driver->reachableFrom(address, record.bytes, self.gpu)))
      buffers_[at] = static_cast<uint8_t*>(address);
    return;
  }
  if (!self.sameKernel(peer)) return;
  if (record.sharedSequence != 0) {
    // Its pid names its allocation's shared object only in its pid namespace.
    if (record.pidNamespace == 0 || record.pidNamespace != pidNamespaceId()) return;
    if (const uint8_t* base = memory::mapPeerAllocation(record.pid, record.sharedSequence))
      buffers_[at] = const_cast<uint8_t*>(base) + record.sharedOffset;
    return;
  }
  if (record.deviceSerial == 0 || !descriptor || driver == nullptr || self.gpu.empty() ||
      !driver->gpusShareMemory(self.gpu, peer.gpu))
    return;
  const cuda::PeerImports::Key key{peer.processId, record.deviceSerial, self.gpu};
  Result<uint8_t*> base = cuda::PeerImports::instance().acquire(*driver, key, record.deviceBytes, descriptor.release());
  if (!base.isOk()) {
    SHOAL_INFO(subsys::kReg, "window ", user_, ": rank ", r, "'s buffer is not mapped here (", base.status().message(),
               ")");
    return;
  }
  imported_.push_back(base.value());
  buffers_[at] = base.value() + record.deviceOffset;
}

WindowFlags Window::mapsFlags(std::string error) const {
  WindowFlags out;
  out.error = std::move(error);
  for (size_t r = 0; r < buffers_.size(); ++r) out.flags.push_back(buffers_[r] != nullptr);
  return out;
}

Status Window::learnMaps(const std::vector<WindowFlags>& all) {
  if (all.size() != maps_.size()) return internalError("window flags of ", all.size(), " ranks");
  for (size_t a = 0; a < all.size(); ++a) {
    if (!all[a].error.empty()) return Status(Code::kInvalidUsage, str("rank ", a, ": ", all[a].error));
    if (all[a].flags.size() != maps_.size())
      return internalError("rank ", a, "'s window flags name ", all[a].flags.size(), " ranks");
    maps_[a] = all[a].flags;
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

namespace {
std::mutex gAllWindowsMutex;
std::vector<std::weak_ptr<Windows>>& allWindows() {
  static auto* all = new std::vector<std::weak_ptr<Windows>>();  // outlives every communicator
  return *all;
}
}  // namespace

std::shared_ptr<Windows> Windows::make() {
  auto windows = std::make_shared<Windows>();
  std::lock_guard<std::mutex> lock(gAllWindowsMutex);
  auto& all = allWindows();
  all.erase(std::remove_if(all.begin(), all.end(), [](const auto& w) { return w.expired(); }), all.end());
  all.push_back(windows);
  return windows;
}

void Windows::retireMemory(const void* base, size_t bytes) {
  std::vector<std::shared_ptr<Windows>> live;
  {
    std::lock_guard<std::mutex> lock(gAllWindowsMutex);
    for (const auto& w : allWindows())
      if (auto l = w.lock()) live.push_back(std::move(l));
  }
  const auto from = reinterpret_cast<uintptr_t>(base);
  for (const auto& windows : live) {
    if (windows->empty()) continue;
    windows->retireWhere([&](const Window& w) {
      const auto at = reinterpret_cast<uintptr_t>(w.userPtr());
      return at < from + bytes && from < at + w.bytes();
    });
  }
}

size_t Windows::retireWhere(const std::function<bool(const Window&)>& which) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t retired = 0;
  for (auto it = windows_.begin(); it != windows_.end();) {
    if (which(**it)) {
      retired_.push_back(std::move(*it));
      retiredAt_.push_back(submitted_.load(std::memory_order_acquire));
      it = windows_.erase(it);
      ++retired;
    } else {
      ++it;
    }
  }
  count_.store(windows_.size(), std::memory_order_release);
  return retired;
}

void Windows::add(std::unique_ptr<Window> window) {
  std::lock_guard<std::mutex> lock(mutex_);
  windows_.push_back(std::move(window));
  count_.store(windows_.size(), std::memory_order_release);
}

bool Windows::retire(const void* handle) {
  return retireWhere([&](const Window& w) { return &w == handle; }) > 0;
}

std::vector<std::unique_ptr<Window>> Windows::takeRetired(uint64_t passed) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::unique_ptr<Window>> released;
  for (size_t i = 0; i < retired_.size();) {
    if (retiredAt_[i] <= passed) {
      released.push_back(std::move(retired_[i]));
      retired_.erase(retired_.begin() + static_cast<std::ptrdiff_t>(i));
      retiredAt_.erase(retiredAt_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  return released;
}

std::vector<std::unique_ptr<Window>> Windows::takeAll() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::unique_ptr<Window>> all = std::move(windows_);
  windows_.clear();
  for (auto& w : retired_) all.push_back(std::move(w));
  retired_.clear();
  retiredAt_.clear();
  count_.store(0, std::memory_order_release);
  return all;
}

Window* Windows::find(const void* handle) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& w : windows_)
    if (w.get() == handle) return w.get();
  return nullptr;
}

bool Windows::holdsEverywhere(const void* p, uint64_t bytes) const {
  const auto address = reinterpret_cast<uint64_t>(p);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = windows_.rbegin(); it != windows_.rend(); ++it) {  // the newest first
    const Window& w = **it;
    if (rangeInside(address, bytes, reinterpret_cast<uint64_t>(w.userPtr()), w.bytes()))
      return w.mappedEverywhere() && w.deviceEverywhere();
  }
  return false;
}

Result<std::optional<Windows::OnStreams>> Windows::onStreams(const void* send, uint64_t sendBytes, const void* recv,
                                                             uint64_t recvBytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto holder = [&](const void* p, uint64_t bytes) -> const Window* {
    for (auto it = windows_.rbegin(); it != windows_.rend(); ++it)  // the newest first
      if (rangeInside(reinterpret_cast<uint64_t>(p), bytes, reinterpret_cast<uint64_t>((*it)->userPtr()), (*it)->bytes()))
        return it->get();
    return nullptr;
  };
  const Window* s = holder(send, sendBytes);
  const Window* r = holder(recv, recvBytes);
  if (s == nullptr || r == nullptr || !s->onStreams() || !r->onStreams()) return std::optional<OnStreams>();
  OnStreams where;
  where.sendRegistration = s->registration();
  where.recvRegistration = r->registration();
  where.sendOffset = reinterpret_cast<uint64_t>(send) - reinterpret_cast<uint64_t>(s->userPtr());
  where.recvOffset = reinterpret_cast<uint64_t>(recv) - reinterpret_cast<uint64_t>(r->userPtr());
  const auto nranks = static_cast<size_t>(s->nranks());
  where.buffers.resize(nranks);
  for (size_t q = 0; q < nranks; ++q) {
    if (where.sendOffset + sendBytes > s->bytesOf(static_cast<int>(q)) ||
        where.recvOffset + recvBytes > r->bytesOf(static_cast<int>(q)))
      return invalidUsage("rank ", q, "'s symmetric windows (", s->bytesOf(static_cast<int>(q)), " and ",
                          r->bytesOf(static_cast<int>(q)), " bytes) do not hold this operation's buffers at this "
                          "rank's offsets (", where.sendOffset, " and ", where.recvOffset,
                          "): windows registered with NCCL_WIN_COLL_SYMMETRIC take buffers at the same offsets on "
                          "every rank");
    where.buffers[q] = {s->buffer(static_cast<int>(q)) + where.sendOffset,
                        r->buffer(static_cast<int>(q)) + where.recvOffset};
  }
  return std::optional<OnStreams>(std::move(where));
}

uint8_t* Windows::find(int peer, uint64_t address, uint64_t bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto* list : {&windows_, &retired_})
    for (auto it = list->rbegin(); it != list->rend(); ++it) {  // the newest first
      const Window& w = **it;
      if (w.buffer(peer) != nullptr && rangeInside(address, bytes, w.addressOf(peer), w.bytesOf(peer)))
        return w.buffer(peer) + (address - w.addressOf(peer));
    }
  return nullptr;
}

namespace {

constexpr uint64_t kTicketMagic = 0x53484f414c574454ull;  // "SHOALWDT"
constexpr size_t kTicketSignedBytes = 32;

std::array<uint8_t, WindowMailbox::kTicketBytes> makeTicket(const WindowMailbox::Ticket& t, std::string_view secret) {
  std::array<uint8_t, WindowMailbox::kTicketBytes> bytes{};
  putLe(bytes.data(), kTicketMagic, 8);
  putLe(bytes.data() + 8, t.commId, 8);
  putLe(bytes.data() + 16, t.registration, 8);
  putLe(bytes.data() + 24, static_cast<uint32_t>(t.from), 4);
  putLe(bytes.data() + 28, static_cast<uint32_t>(t.to), 4);
  const net::Digest proof = net::hmacSha256(
      secret, std::string_view(reinterpret_cast<const char*>(bytes.data()), kTicketSignedBytes));
  std::memcpy(bytes.data() + kTicketSignedBytes, proof.data(), proof.size());
  return bytes;
}

}  // namespace

Result<WindowMailbox> WindowMailbox::open() {
  WindowMailbox box;
  SHOAL_ASSIGN_OR_RETURN(box.listener_, net::listenAbstract("shoal-window", box.name_), "a window mailbox");
  return box;
}

Status WindowMailbox::send(const std::string& mailbox, int fd, const Ticket& ticket, std::string_view secret,
                           Deadline deadline) {
  SHOAL_ASSIGN_OR_RETURN(net::Fd socket, net::connectAbstract(mailbox, deadline));
  const std::array<uint8_t, kTicketBytes> bytes = makeTicket(ticket, secret);
  const int fds[1] = {fd};
  return net::sendWithDescriptors(socket.get(), bytes.data(), bytes.size(), fds);
}

Result<std::vector<net::Fd>> WindowMailbox::receive(const std::vector<bool>& from, Ticket expected,
                                                    std::string_view secret, Deadline deadline) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<std::vector<net::Fd>> got,
                         receiveEach({Wanted{expected, from}}, secret, deadline));
  return std::move(got[0]);
}

Result<std::vector<std::vector<net::Fd>>> WindowMailbox::receiveEach(const std::vector<Wanted>& wanted,
                                                                     std::string_view secret, Deadline deadline) {
  std::vector<std::vector<net::Fd>> got(wanted.size());
  size_t missing = 0;
  for (size_t k = 0; k < wanted.size(); ++k) {
    got[k].resize(wanted[k].from.size());
    missing += static_cast<size_t>(std::count(wanted[k].from.begin(), wanted[k].from.end(), true));
  }
  std::vector<net::Fd> pending;  // accepted, message not read yet
  while (missing > 0) {
    for (net::Fd c = net::acceptSameUser(listener_.get()); c; c = net::acceptSameUser(listener_.get()))
      pending.push_back(std::move(c));
    for (auto it = pending.begin(); it != pending.end();) {
      std::array<uint8_t, kTicketBytes> bytes{};
      Result<std::vector<net::Fd>> fds = net::receiveWithDescriptors(it->get(), bytes.data(), bytes.size(), 1);
      if (!fds.isOk() && fds.status().code() == Code::kAgain) {
        ++it;
        continue;
      }
      it = pending.erase(it);
      if (!fds.isOk()) continue;  // malformed: not one of ours
      const int sender = static_cast<int>(getLe(bytes.data() + 24, 4));
      bool taken = false;
      for (size_t k = 0; k < wanted.size() && !taken; ++k) {
        Ticket expected = wanted[k].ticket;
        expected.from = sender;
        const std::array<uint8_t, kTicketBytes> want = makeTicket(expected, secret);
        if (sender < 0 || static_cast<size_t>(sender) >= wanted[k].from.size() ||
            !wanted[k].from[static_cast<size_t>(sender)] || got[k][static_cast<size_t>(sender)] ||
            !net::constantTimeEqual(bytes.data(), want.data(), want.size()))
          continue;
        got[k][static_cast<size_t>(sender)] = std::move(fds.value()[0]);
        --missing;
        taken = true;
      }
      if (!taken)
        SHOAL_INFO(subsys::kReg, "window mailbox @", name_, ": refused a descriptor that no peer of this "
                   "registration sent");
    }
    if (missing == 0) break;
    if (deadline.expired())
      return error(Code::kTimeout, missing, " window descriptor(s) announced by peers did not arrive at @", name_);
    pollfd pfd{listener_.get(), POLLIN, 0};
    (void)::poll(&pfd, 1, 5);
  }
  return got;
}

}  // namespace shoal
