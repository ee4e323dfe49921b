#include "engine/peer_window.h"

#include <cstring>

#include "core/process.h"
#include "engine/engine.h"
#include "memory/shared_memory.h"

namespace shoal {
namespace {

// One slot: what a rank tells its peers about its buffers.
struct WindowDescriptor {
  uint64_t magic;
  int32_t pid;
  int32_t reserved;
  uint64_t address[2];         // send, recv
  uint64_t sharedSequence[2];  // 0: not in a shared allocation
  uint64_t sharedOffset[2];
};
static_assert(sizeof(WindowDescriptor) == kWindowSlotBytes);
constexpr uint64_t kWindowMagic = 0x53484f414c57494eull;  // "SHOALWIN"

}  // namespace

void PeerWindow::describeOwn(int nranks, const uint8_t* send, uint64_t sendBytes, const uint8_t* recv,
                             uint64_t recvBytes, const PeerBuffers* peerBuffers) {
  peerBuffers_ = peerBuffers;
  bytes_[0] = sendBytes;
  bytes_[1] = recvBytes;
  window_.assign(kWindowSlotBytes * (1 + static_cast<size_t>(nranks)), 0);
  views_.assign(static_cast<size_t>(nranks), PeerView{});
  WindowDescriptor d{};
  d.magic = kWindowMagic;
  d.pid = static_cast<int32_t>(currentPid());
  const uint8_t* bases[2] = {send, recv};
  const uint64_t sizes[2] = {sendBytes, recvBytes};
  for (int b = 0; b < 2; ++b) {
    d.address[b] = reinterpret_cast<uint64_t>(bases[b]);
    if (auto where = memory::findShared(bases[b], sizes[b])) {
      d.sharedSequence[b] = where->sequence;
      d.sharedOffset[b] = where->offset;
    }
  }
  std::memcpy(window_.data(), &d, sizeof(d));
}

Status PeerWindow::resolve(int peer) {
  PeerView& view = views_[static_cast<size_t>(peer)];
  if (view.resolved) return Status::ok();
  WindowDescriptor d;
  std::memcpy(&d, window_.data() + kWindowSlotBytes * (1 + static_cast<size_t>(peer)), sizeof(d));
  if (d.magic != kWindowMagic)
    return internalError("rank ", peer, "'s buffer descriptor has not arrived or is corrupt");
  view.pid = d.pid;
  for (int b = 0; b < 2; ++b) {
    view.address[b] = d.address[b];
    if (peerBuffers_) {
      view.base[b] = bytes_[b] ? peerBuffers_->find(peer, d.address[b], bytes_[b]) : nullptr;
    } else if (d.pid == static_cast<int32_t>(currentPid())) {
      view.base[b] = reinterpret_cast<const uint8_t*>(d.address[b]);  // same process
    } else if (d.sharedSequence[b] != 0) {
      const uint8_t* mapped = memory::mapPeerAllocation(d.pid, d.sharedSequence[b]);
      view.base[b] = mapped ? mapped + d.sharedOffset[b] : nullptr;
    }
  }
  view.resolved = true;
  return Status::ok();
}

Result<uint8_t*> PeerWindow::mapped(const Slice& slice) {
  const int peer = peerOfBuffer(slice.buffer);
  if (peer < 0 || peer >= static_cast<int>(views_.size()))
    return internalError("plan names peer buffer of rank ", peer, " outside its window");
  SHOAL_TRY(resolve(peer));
  const uint8_t* base = views_[static_cast<size_t>(peer)].base[localKindOfPeerBuffer(slice.buffer)];
  return base ? const_cast<uint8_t*>(base) + slice.offset : nullptr;
}

Status PeerWindow::read(const Slice& slice, uint64_t at, uint8_t* into, uint64_t bytes) const {
  const int peer = peerOfBuffer(slice.buffer);
  const PeerView& view = views_[static_cast<size_t>(peer)];
  if (!view.resolved) return internalError("rank ", peer, "'s buffer read before its descriptor was resolved");
  SHOAL_TRY(memory::readPeerMemory(view.pid, view.address[localKindOfPeerBuffer(slice.buffer)] + slice.offset + at,
                                   into, bytes))
      << "reading rank " << peer << "'s buffer";
  return Status::ok();
}

}  // namespace shoal
