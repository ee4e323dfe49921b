// PeerWindow: how a job of a peer-reading plan (Plan::readsPeers) reaches
// the buffers of ranks in other processes of its host.
//
// Role: the plan's kWindowBuffer holds 1 + nranks descriptor slots. This rank
// describes its own send and receive buffers in slot 0 (describeOwn); the
// plan's messages carry each peer's descriptor into slot 1 + q; resolving one
// maps the peer's buffer here when it can (same process, or an allocation the
// peer shares: memory/shared_memory.h) and otherwise keeps its remote address
// for process_vm_readv (read()). A device plan's window resolves through
// the job's PeerBuffers (windows the ranks registered) alone.
// Thread: the thread progressing the job (the engine's rule for job state).
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/plan.h"
#include "core/status.h"

namespace shoal {

class PeerBuffers;

class PeerWindow {
 public:
  // Starts a run of a plan over `nranks`: slot 0 describes this rank's
  // buffers; what earlier runs resolved is forgotten.
  // Peers' buffers are the same sizes as this rank's; `peerBuffers` (a
  // device plan's windows, else null) is where they are looked up.
  void describeOwn(int nranks, const uint8_t* send, uint64_t sendBytes, const uint8_t* recv, uint64_t recvBytes,
                   const PeerBuffers* peerBuffers = nullptr);
  // The window area itself (the plan's kWindowBuffer).
  uint8_t* bytes() { return window_.data(); }
  // Where a peer buffer's slice lies in this process; nullptr when the
  // peer's buffer is not mapped here (read() it). Its descriptor must have
  // arrived (the plan's dependencies order that).
  Result<uint8_t*> mapped(const Slice& slice);
  // Copies `bytes` at `at` past the slice's offset out of a peer buffer that
  // is not mapped here.
  Status read(const Slice& slice, uint64_t at, uint8_t* into, uint64_t bytes) const;

 private:
  Status resolve(int peer);

  std::vector<uint8_t> window_;
  const PeerBuffers* peerBuffers_ = nullptr;
  uint64_t bytes_[2] = {0, 0};  // send, recv
  struct PeerView {
    bool resolved = false;
    int pid = 0;
    const uint8_t* base[2] = {nullptr, nullptr};  // send, recv; null: read by process_vm_readv
    uint64_t address[2] = {0, 0};                 // in the peer's address space
  };
  std::vector<PeerView> views_;
};

}  // namespace shoal
